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


class Job(models.Model):
    """E3, E5: a deferred request — accepted with 202, run by a Celery worker, fetched later.

    The request is kept as parsed JSON (the caller's credential never is: the key's id names
    the caller). A run holds the job's lease; a run that dies leaves it to expire, and the
    resume task puts the job back (``gateway/jobs.py``).
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    id = models.CharField(max_length=40, primary_key=True)
    generation_id = models.CharField(max_length=40)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    deadline_at = models.DateTimeField()
    tenant_id = models.BigIntegerField()
    app_id = models.BigIntegerField(db_index=True)
    api_key_id = models.BigIntegerField()
    workload_class = models.CharField(max_length=50)
    model = models.CharField(max_length=200)
    request = models.JSONField()  # the body as the client sent it to its door
    door = models.CharField(max_length=16, default="chat")
    session_id = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    next_try_at = models.DateTimeField(default=timezone.now)
    lease_until = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    lost_runs = models.PositiveSmallIntegerField(default=0)
    finished_at = models.DateTimeField(null=True, blank=True)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    # E5: a line of a batch (its driver runs it, not a task of its own), and the line's names.
    batch = models.ForeignKey(
        "gateway.Batch", null=True, blank=True, on_delete=models.CASCADE, related_name="lines"
    )
    custom_id = models.CharField(max_length=512, blank=True, default="")
    line = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["status", "next_try_at"], name="job_due"),
            models.Index(fields=["batch", "status", "line"], name="job_batch_line"),
        ]

    def __str__(self) -> str:
        return self.id


class StoredResponse(models.Model):
    """An answer of the Responses door (``store``, on by default as in OpenAI's API), kept for
    ``GET /v1/responses/{id}`` and for a later turn's ``previous_response_id``.

    Visible to the keys of the app that made it; deleted ``RESPONSE_RETENTION_SECONDS`` after
    it was made (``gateway/response_store.py``). The usage is the ledger's (``generation_id``).
    """

    id = models.CharField(max_length=64, primary_key=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    tenant_id = models.BigIntegerField()
    app_id = models.BigIntegerField()
    api_key_id = models.BigIntegerField()
    generation_id = models.CharField(max_length=40)
    model = models.CharField(max_length=200)
    # The session the client named (X-Session-Id, prompt_cache_key), carried on to later
    # turns for the router's stickiness (G12); "" when it named none.
    session = models.CharField(max_length=256, blank=True, default="")
    # The conversation up to and including this answer, as chat messages: a later turn's
    # history. The instructions are not in it: a later turn brings its own.
    conversation = models.JSONField()
    response = models.JSONField()  # the Response object as the client got it

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.id


# The Batch API's records, in their own module (a god module is a review finding).
from gateway.batch_models import Batch, BatchFile  # noqa: E402

__all__ = ["Batch", "BatchFile", "Generation", "Job", "StoredResponse"]
