"""E5: the Batch API's services — a batch, its lines as jobs, its output and error files.

A batch's lines are ``Job`` rows of the batch workload class (``BATCH_WORKLOAD``), made when a
worker first takes the batch (validating → in_progress). Each runs through the same pipeline as
a deferred request, under the job's own lease (``jobs.job_lease``): a line is taken by one run
at a time, and its answer, once stored, is never asked for again. A run whose worker died is put
back in line by the resume task; it is sent again with the same ``Idempotency-Key`` (the job's
id), so a provider that keeps keys answers it from the first call (``gateway/dispatch.py``).
When no line is left to run the batch is finalized: its output file (the lines answered 2xx)
and its error file (the others), in OpenAI's shapes, written in one transaction with the
batch's last status.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any

import orjson
from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, QuerySet

from common.background import background_app
from gateway import jobs
from gateway.batch_files import BATCH_DOORS, batch_lines_parse
from gateway.batch_models import Batch, BatchFile
from gateway.errors import GatewayError, InvalidRequest, NotFound
from gateway.models import Job
from tenants.identity import Principal

COMPLETION_WINDOWS = {"24h": dt.timedelta(hours=24)}
FILE_ID = re.compile(r"file-[A-Za-z0-9]{1,32}")
BATCH_ID = re.compile(r"batch_[A-Za-z0-9]{1,32}")
MAX_METADATA = 16  # pairs, keys up to 64 and values up to 512 characters (OpenAI's)
LIST_LIMIT = (1, 100, 20)  # smallest, largest, default ``limit`` of GET /v1/batches
OPEN = (
    Batch.Status.VALIDATING,
    Batch.Status.IN_PROGRESS,
    Batch.Status.FINALIZING,
    Batch.Status.CANCELLING,
)


class BatchNotCancellable(GatewayError):
    """POST /v1/batches/{id}/cancel of a batch that has ended or is ending."""

    status = 409
    type = "invalid_request_error"
    code = "batch_not_cancellable"


# The task that drives a batch, by name (gateway/tasks.py imports the runner, which imports this).
BATCH_RUN_TASK = "gateway.tasks.batch_run"


def batch_create(
    *,
    principal: Principal,
    input_file_id: Any,
    endpoint: Any,
    completion_window: Any,
    metadata: Any,
    now: dt.datetime,
) -> Batch:
    # A JSON list or object is no endpoint (and cannot be looked up: unhashable).
    if not isinstance(endpoint, str) or endpoint not in BATCH_DOORS:
        raise InvalidRequest(
            f"endpoint must be one of {', '.join(BATCH_DOORS)} (got {endpoint!r}).",
            param="endpoint",
            code="invalid_value",
        )
    if not isinstance(completion_window, str) or completion_window not in COMPLETION_WINDOWS:
        raise InvalidRequest(
            f"completion_window must be one of {', '.join(COMPLETION_WINDOWS)}.",
            param="completion_window",
            code="invalid_value",
        )
    _metadata_check(metadata)
    if not isinstance(input_file_id, str) or not FILE_ID.fullmatch(input_file_id):
        raise InvalidRequest(
            "input_file_id must name a file (file-…, as POST /v1/files answered).",
            param="input_file_id",
        )
    file = (
        BatchFile.objects.filter(pk=input_file_id, tenant_id=principal.tenant_id)
        .only("id", "purpose")
        .first()
    )
    if file is None:
        raise NotFound(f"No file {input_file_id}.", param="input_file_id")
    if file.purpose != BatchFile.Purpose.BATCH:
        raise InvalidRequest(
            f"File {file.id} is not a batch input file (purpose '{file.purpose}').",
            param="input_file_id",
            code="invalid_value",
        )
    batch = Batch.objects.create(
        id=f"batch_{uuid.uuid4().hex[:24]}",
        created_at=now,
        tenant_id=principal.tenant_id,
        app_id=principal.app_id,
        api_key_id=principal.key_id,
        endpoint=endpoint,
        input_file=file,
        completion_window=completion_window,
        expires_at=now + COMPLETION_WINDOWS[completion_window],
        metadata=metadata,
    )
    transaction.on_commit(lambda: batch_enqueue(batch.id))
    return batch


def _metadata_check(metadata: Any) -> None:
    if metadata is None:
        return
    fits = (
        isinstance(metadata, dict)
        and len(metadata) <= MAX_METADATA
        and all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= 64
            and len(v) <= 512
            and "\x00" not in k + v
            for k, v in metadata.items()
        )
    )
    if not fits:
        raise InvalidRequest(
            f"metadata must be an object of at most {MAX_METADATA} string pairs "
            "(keys up to 64 characters, values up to 512).",
            param="metadata",
            code="invalid_value",
        )


def batch_enqueue(batch_id: str, countdown: float = 0.0) -> None:
    background_app().send_task(BATCH_RUN_TASK, (batch_id,), countdown=countdown, ignore_result=True)


def batch_get(*, tenant_id: int, batch_id: str) -> Batch:
    """The tenant's batch; any other id, another tenant's included, is the same 404."""
    found = Batch.objects.filter(pk=batch_id, tenant_id=tenant_id).first()
    if found is None:
        raise NotFound(f"No batch {batch_id}.", param="batch_id")
    return found


def batches_list(*, tenant_id: int, after: str | None, limit: int) -> tuple[list[Batch], bool]:
    """The tenant's batches, newest first, those after the batch ``after`` in that order."""
    rows: QuerySet[Batch] = Batch.objects.filter(tenant_id=tenant_id)
    if after:
        cursor = rows.filter(pk=after).values_list("created_at", flat=True).first()
        if cursor is None:
            raise NotFound(f"No batch {after}.", param="after")
        rows = rows.filter(Q(created_at__lt=cursor) | Q(created_at=cursor, id__lt=after))
    found = list(rows.order_by("-created_at", "-id")[: limit + 1])
    return found[:limit], len(found) > limit


def batch_cancel(batch: Batch, now: dt.datetime) -> Batch:
    """An open batch starts cancelling: its waiting lines are not run, running ones end."""
    moved = Batch.objects.filter(
        pk=batch.pk, status__in=(Batch.Status.VALIDATING, Batch.Status.IN_PROGRESS)
    ).update(status=Batch.Status.CANCELLING, cancelling_at=now)
    batch.refresh_from_db()
    if not moved and batch.status != Batch.Status.CANCELLING:
        raise BatchNotCancellable(f"Batch {batch.id} is {batch.status}; it cannot be cancelled.")
    if moved:
        transaction.on_commit(lambda: batch_enqueue(batch.id))
    return batch


# -- the driver's steps (gateway/batch_runner.py) ------------------------------------------------


def batch_lease(batch_id: str, now: dt.datetime) -> Batch | None:
    """Take the batch for one driver, or None: ended, or a live driver holds it."""
    taken = (
        Batch.objects.filter(pk=batch_id, status__in=OPEN)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .update(lease_until=_lease_end(now))
    )
    return Batch.objects.get(pk=batch_id) if taken else None


def batch_lease_extend(batch_id: str, now: dt.datetime) -> None:
    Batch.objects.filter(pk=batch_id, status__in=OPEN).update(lease_until=_lease_end(now))


def batch_lease_drop(batch_id: str) -> None:
    Batch.objects.filter(pk=batch_id).update(lease_until=None)


def batch_start(batch_id: str, now: dt.datetime) -> Batch:
    """validating → in_progress with one job per line, or → failed with the reasons.

    One transaction: a driver that dies halfway leaves the batch validating and no line, and
    the next driver starts it again."""
    with transaction.atomic():
        batch = Batch.objects.select_for_update().get(pk=batch_id)
        if batch.status == Batch.Status.CANCELLING and not batch.lines.exists():
            return _batch_end(batch, Batch.Status.CANCELLED, now)
        if batch.status != Batch.Status.VALIDATING:
            return batch
        content = bytes(
            BatchFile.objects.filter(pk=batch.input_file_id).values_list("content", flat=True)[0]
        )
        lines = batch_lines_parse(content)  # checked on upload: the same rules hold
        errors = [
            {
                "code": "mismatched_endpoint",
                "message": f"The line's url {line.url} is not the batch's {batch.endpoint}.",
                "param": "url",
                "line": line.line,
            }
            for line in lines
            if line.url != batch.endpoint
        ]
        if errors:
            batch.errors = {"object": "list", "data": errors[:100]}
            batch.total = len(lines)
            batch.status, batch.failed_at = Batch.Status.FAILED, now
            batch.lease_until = None
            batch.save()
            return batch
        door = BATCH_DOORS[batch.endpoint]
        Job.objects.bulk_create(
            (
                Job(
                    id=f"job-{uuid.uuid4().hex}",
                    generation_id=f"gen-{uuid.uuid4().hex}",
                    created_at=now,
                    deadline_at=batch.expires_at,
                    tenant_id=batch.tenant_id,
                    app_id=batch.app_id,
                    api_key_id=batch.api_key_id,
                    workload_class=settings.BATCH_WORKLOAD,
                    model=str(line.body["model"])[:200],
                    request=line.body,
                    door=door,
                    batch=batch,
                    custom_id=line.custom_id,
                    line=line.line,
                    next_try_at=now,
                )
                for line in lines
            ),
            batch_size=1000,
        )
        batch.total = len(lines)
        batch.status, batch.in_progress_at = Batch.Status.IN_PROGRESS, now
        batch.save(update_fields=["total", "status", "in_progress_at"])
        return batch


def batch_lines_take(batch: Batch, limit: int, now: dt.datetime) -> list[Job]:
    """Up to ``limit`` of the batch's lines due now, each leased for one run (in file order)."""
    if limit <= 0:
        return []
    due = (
        Job.objects.filter(batch=batch, status=Job.Status.QUEUED, next_try_at__lte=now)
        .order_by("line")
        .values_list("pk", flat=True)[:limit]
    )
    taken = []
    for job_id in list(due):
        job = jobs.job_lease(job_id, now)
        if job is not None:
            taken.append(job)
    return taken


def batch_lines_open(batch: Batch) -> int:
    """Lines not answered yet: waiting, or run by some worker (maybe a dead one's)."""
    return Job.objects.filter(batch=batch).exclude(status__in=Job.FINISHED).count()


def batch_lines_stop(batch: Batch, now: dt.datetime, *, code: str, message: str) -> int:
    """The batch's waiting lines end unrun (cancelled, or the window closed)."""
    error = {
        "message": message,
        "type": "invalid_request_error",
        "code": code,
        "param": None,
        "reason": code,
    }
    return Job.objects.filter(batch=batch, status=Job.Status.QUEUED).update(
        status=Job.Status.CANCELLED,
        finished_at=now,
        response_status=None,
        response={"status_code": None, "headers": {}, "body": {"error": error}},
    )


def batch_status(batch_id: str) -> Batch:
    return Batch.objects.get(pk=batch_id)


def batch_finalize(batch_id: str, now: dt.datetime) -> Batch:
    """Write the output and error files and end the batch (completed, expired or cancelled).

    One transaction, on the locked batch: a driver that dies here leaves the batch as it was,
    and the next one finalizes it, so the files are written once."""
    with transaction.atomic():
        batch = Batch.objects.select_for_update().get(pk=batch_id)
        if batch.status in Batch.FINISHED:
            return batch
        if batch.status == Batch.Status.CANCELLING:
            final = Batch.Status.CANCELLED
        elif now >= batch.expires_at:
            final = Batch.Status.EXPIRED
        else:
            final = Batch.Status.COMPLETED
        batch.status, batch.finalizing_at = Batch.Status.FINALIZING, batch.finalizing_at or now
        output: list[bytes] = []
        errors: list[bytes] = []
        lines = (
            Job.objects.filter(batch=batch)
            .order_by("line")
            .values_list("id", "generation_id", "custom_id", "response_status", "response")
        )
        for job_id, generation_id, custom_id, status, response in lines.iterator(chunk_size=2000):
            record = batch_line_record(job_id, generation_id, custom_id, status, response)
            (output if status is not None and status < 400 else errors).append(orjson.dumps(record))
        batch.completed, batch.failed = len(output), len(errors)
        if output:
            batch.output_file = _output_file(batch, "output", output, now)
        if errors:
            batch.error_file = _output_file(batch, "errors", errors, now)
        return _batch_end(batch, final, now)


def batch_line_record(
    job_id: str, generation_id: str, custom_id: str, status: int | None, response: Any
) -> dict[str, Any]:
    """One line of an output or error file, in OpenAI's shape."""
    record: dict[str, Any] = {
        "id": f"batch_req_{job_id.removeprefix('job-')}",
        "custom_id": custom_id,
    }
    body = (response or {}).get("body")
    if status is None:  # never run: cancelled, expired, or lost
        error = (body or {}).get("error") or {}
        record["response"] = None
        record["error"] = {
            "code": error.get("code", "batch_line_not_run"),
            "message": error.get("message", "The request was not run."),
        }
    else:
        record["response"] = {"status_code": status, "request_id": generation_id, "body": body}
        record["error"] = None
    return record


def _output_file(batch: Batch, kind: str, records: list[bytes], now: dt.datetime) -> BatchFile:
    content = b"\n".join(records) + b"\n"
    return BatchFile.objects.create(
        id=f"file-{uuid.uuid4().hex[:24]}",
        created_at=now,
        tenant_id=batch.tenant_id,
        app_id=batch.app_id,
        api_key_id=batch.api_key_id,
        purpose=BatchFile.Purpose.BATCH_OUTPUT,
        filename=f"{batch.id}_{kind}.jsonl",
        bytes=len(content),
        lines=len(records),
        content=content,
    )


def _batch_end(batch: Batch, status: str, now: dt.datetime) -> Batch:
    batch.status = status
    stamp = {
        Batch.Status.COMPLETED: "completed_at",
        Batch.Status.EXPIRED: "expired_at",
        Batch.Status.CANCELLED: "cancelled_at",
    }[status]
    setattr(batch, stamp, now)
    batch.lease_until = None
    batch.save()
    return batch


def batches_due(now: dt.datetime) -> list[str]:
    """Open batches no live driver holds (never started, or their driver died)."""
    return list(
        Batch.objects.filter(status__in=OPEN)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .values_list("pk", flat=True)
    )


def batch_counts(batch: Batch) -> dict[str, int]:
    """``request_counts``: kept on the batch once it ended, counted from its lines before."""
    if batch.status in Batch.FINISHED:
        return {"total": batch.total, "completed": batch.completed, "failed": batch.failed}
    counts = Job.objects.filter(batch=batch, status__in=Job.FINISHED).aggregate(
        completed=Count("pk", filter=Q(response_status__lt=400)),
        done=Count("pk"),
    )
    completed, failed = counts["completed"], counts["done"] - counts["completed"]
    if batch.provider_counts:  # sent to a provider's batch API: its progress, until answered
        completed = max(completed, int(batch.provider_counts.get("completed", 0)))
        failed = max(failed, int(batch.provider_counts.get("failed", 0)))
    return {"total": batch.total, "completed": completed, "failed": failed}


def batch_data(batch: Batch) -> dict[str, Any]:
    """A batch as OpenAI's API shows one."""

    def stamp(value: dt.datetime | None) -> int | None:
        return int(value.timestamp()) if value else None

    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": batch.errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": stamp(batch.created_at),
        "in_progress_at": stamp(batch.in_progress_at),
        "expires_at": stamp(batch.expires_at),
        "finalizing_at": stamp(batch.finalizing_at),
        "completed_at": stamp(batch.completed_at),
        "failed_at": stamp(batch.failed_at),
        "expired_at": stamp(batch.expired_at),
        "cancelling_at": stamp(batch.cancelling_at),
        "cancelled_at": stamp(batch.cancelled_at),
        "request_counts": batch_counts(batch),
        "metadata": batch.metadata,
    }


def _lease_end(now: dt.datetime) -> dt.datetime:
    return now + dt.timedelta(seconds=settings.JOB_LEASE_SECONDS)
