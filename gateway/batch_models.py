"""E5: the Batch API's records — uploaded files and batches (OpenAI's shapes).

A batch's lines are ``Job`` rows (``Job.batch``): each runs through the deferred-jobs pipeline
under its own lease, and its stored answer is the line's result, so a worker that dies loses
no line and a line is answered once (``gateway/batches.py``).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class BatchFile(models.Model):
    """``POST /v1/files``: a batch's input (purpose ``batch``), or one Switchyard wrote — a
    batch's output or error file (``batch_output``). The bytes live in the row: a batch file is
    JSONL of at most ``BATCH_FILE_MAX_BYTES``."""

    class Purpose(models.TextChoices):
        BATCH = "batch"
        BATCH_OUTPUT = "batch_output"

    id = models.CharField(max_length=40, primary_key=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    tenant_id = models.BigIntegerField(db_index=True)
    app_id = models.BigIntegerField(null=True)
    api_key_id = models.BigIntegerField(null=True)
    purpose = models.CharField(max_length=16, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField(default=0)
    lines = models.PositiveIntegerField(default=0)
    content = models.BinaryField()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.id


class Batch(models.Model):
    """``POST /v1/batches``: one input file's lines, run within ``completion_window``.

    validating → in_progress → finalizing → completed, or failed (the file's lines do not fit
    the batch), expired (the window closed first), cancelling → cancelled. A worker drives an
    open batch under ``lease_until``; one that dies leaves it to expire, and the resume task
    hands the batch to another (``gateway/batch_runner.py``).
    """

    class Status(models.TextChoices):
        VALIDATING = "validating"
        FAILED = "failed"
        IN_PROGRESS = "in_progress"
        FINALIZING = "finalizing"
        COMPLETED = "completed"
        EXPIRED = "expired"
        CANCELLING = "cancelling"
        CANCELLED = "cancelled"

    FINISHED = (Status.FAILED, Status.COMPLETED, Status.EXPIRED, Status.CANCELLED)

    id = models.CharField(max_length=40, primary_key=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    tenant_id = models.BigIntegerField()
    app_id = models.BigIntegerField()
    api_key_id = models.BigIntegerField()
    endpoint = models.CharField(max_length=64)
    input_file = models.ForeignKey(BatchFile, on_delete=models.PROTECT, related_name="+")
    completion_window = models.CharField(max_length=8, default="24h")
    expires_at = models.DateTimeField()
    metadata = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.VALIDATING)
    errors = models.JSONField(null=True, blank=True)  # why it failed: OpenAI's list of errors
    output_file = models.ForeignKey(
        BatchFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error_file = models.ForeignKey(
        BatchFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)  # counts kept once the batch ends
    failed = models.PositiveIntegerField(default=0)
    lease_until = models.DateTimeField(null=True, blank=True)
    # E5: how its lines run — "" not decided yet, "lines" each a job here, "provider" sent
    # whole to an endpoint's batch API (gateway/provider_batches.py): which endpoint (router
    # key), the provider's batch id once made, and the provider's counts while it runs.
    path = models.CharField(max_length=8, blank=True, default="")
    provider_endpoint = models.CharField(max_length=200, blank=True, default="")
    provider_batch_id = models.CharField(max_length=100, blank=True, default="")
    provider_counts = models.JSONField(null=True, blank=True)
    # USD its written answers cost that the tenant's spend buckets were not charged yet: set in
    # the transaction that writes the answers, cleared once Redis took it, so a driver that
    # dies in between leaves it to the next (gateway/provider_batch_results.py).
    spend_owed = models.FloatField(default=0.0)
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "batches"
        indexes = [models.Index(fields=["tenant_id", "-created_at"], name="batch_tenant_recent")]

    def __str__(self) -> str:
        return self.id
