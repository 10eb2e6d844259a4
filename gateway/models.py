"""The usage ledger: one row per logical request (OpenRouter calls it a generation)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Generation(models.Model):
    """Written off the hot path: the proxy pushes a record to Redis, a Celery task stores it."""

    id = models.CharField(max_length=40, primary_key=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # Identity, denormalised as ids and names so the row survives renames and deletions.
    tenant_id = models.BigIntegerField(db_index=True)
    team_id = models.BigIntegerField(null=True)
    app_id = models.BigIntegerField(null=True)
    api_key_id = models.BigIntegerField(null=True)
    workload_class = models.CharField(max_length=50, blank=True, default="")
    model = models.CharField(max_length=200)
    provider = models.CharField(max_length=100, blank=True, default="")
    upstream_model = models.CharField(max_length=200, blank=True, default="")
    status = models.PositiveSmallIntegerField()
    reason_code = models.CharField(max_length=64, blank=True, default="")
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    streamed = models.BooleanField(default=False)
    cancelled = models.BooleanField(default=False)
    input_tokens = models.PositiveIntegerField(default=0)
    cached_input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    estimated_input_tokens = models.PositiveIntegerField(default=0)
    estimated_output_tokens = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=8, default=0)
    latency_ms = models.FloatField(null=True)
    ttft_ms = models.FloatField(null=True)
    attempts = models.PositiveSmallIntegerField(default=1)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant_id", "-created_at"], name="generation_tenant_recent")
        ]

    def __str__(self) -> str:
        return self.id
