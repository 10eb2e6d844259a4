"""E3, E5: deferred requests — accepted at once (202), run by a Celery worker, fetched later.

A request of a class whose overload action is ``defer`` (background, batch) that carries
``Prefer: respond-async`` (RFC 7240) is stored as a job and answered ``202 Accepted`` with
``Location: /v1/jobs/{id}``. A Celery worker (``gateway/job_runner.py``) runs it through the same
pipeline as a synchronous request — the fair queue, dispatch, retries within the class's budget,
reconciliation — trying again while capacity is short, until the class's deadline. The answer,
or the error envelope, is stored on the job: ``GET /v1/jobs/{id}``.

Why not a long synchronous wait: a proxy's idle timeout or a client that gives up would cancel
the work, and a gateway restart would lose it ("not just a very long synchronous queue", E5).

Run at most once at a time: Celery may deliver a task twice (acks_late, a lost worker, the
visibility timeout). A run first takes the job's lease with one conditional UPDATE; a second
delivery finds it taken and stops. A run that dies leaves its lease to expire, and the resume
task (beat) queues the job again — at most ``MAX_LOST_RUNS`` times, so a job that kills its
worker cannot loop forever.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, F, Min
from django.http import HttpRequest

from common.background import background_app
from common.db import database_work
from gateway.call import Call
from gateway.errors import InvalidRequest, ServiceUnavailable
from gateway.ledger import without_nul
from gateway.models import Job

log = logging.getLogger(__name__)

PREFER_ASYNC = "respond-async"
MAX_LOST_RUNS = 3


def wants_deferral(request: HttpRequest, call: Call) -> bool:
    """Did the caller ask for a job (``Prefer: respond-async``), and may this request be one?"""
    prefer = request.headers.get("prefer", "")
    if PREFER_ASYNC not in (token.strip().lower() for token in prefer.split(",")):
        return False
    if call.workload.overload_action != "defer":
        raise InvalidRequest(
            f"Workload '{call.workload.name}' is answered synchronously; only classes whose "
            "overload action is 'defer' run as jobs (Prefer: respond-async).",
            param="Prefer",
            code="deferral_not_allowed",
        )
    if call.stream:
        raise InvalidRequest(
            "A deferred request cannot stream; drop 'stream' or 'Prefer: respond-async'.",
            param="stream",
        )
    return True


def job_storable(raw: bytes, body: dict[str, Any]) -> None:
    """PostgreSQL keeps no NUL character in text or jsonb: a deferred request with one is
    refused here (400, naming the field), not by the database as it is stored."""
    if b"\\u0000" not in raw:  # JSON can only carry NUL escaped: most bodies stop here
        return
    path = nul_path(body, "")
    if path is not None:
        raise InvalidRequest(
            f"{path or 'body'}: a deferred request cannot contain NUL characters (\\u0000).",
            param=path or None,
            code="invalid_value",
        )


def nul_path(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{path}.{key}" if path else key
            found = inner if "\x00" in key else nul_path(item, inner)
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = nul_path(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


async def job_submit(call: Call, body: dict[str, Any], session_id: str) -> Job:
    """Store the request as a job and hand it to a worker."""
    try:
        return await database_work(_job_create)(call, body, session_id)
    except DatabaseError as exc:
        raise ServiceUnavailable("Switchyard cannot store jobs right now; retry shortly.") from exc


def _job_create(call: Call, body: dict[str, Any], session_id: str) -> Job:
    principal = call.principal
    assert principal is not None and call.model is not None
    job = Job.objects.create(
        id=f"job-{uuid.uuid4().hex}",
        generation_id=call.id,
        created_at=_datetime(call.created),
        deadline_at=_datetime(call.deadline),
        tenant_id=principal.tenant_id,
        app_id=principal.app_id,
        api_key_id=principal.key_id,
        workload_class=call.workload.name,
        model=call.request.model if call.request else "",
        request=body,
        door=call.door.name,
        session_id=session_id[:200],
    )
    try:
        job_enqueue(job.id)
    except Exception:  # the Celery broker: the resume task finds the job, it stays queued
        log.warning("could not hand job %s to a worker now", job.id, exc_info=True)
    return job


# The task that runs a job, by name: its module (gateway/tasks.py) imports the runner, which
# imports this module, so the job is handed over by name and the imports run one way.
JOB_RUN_TASK = "gateway.tasks.job_run"


def job_enqueue(job_id: str, countdown: float = 0.0) -> None:
    """Hand the job to a Celery worker, at once or ``countdown`` seconds from now."""
    background_app().send_task(JOB_RUN_TASK, (job_id,), countdown=countdown, ignore_result=True)


def job_lease(job_id: str, now: dt.datetime) -> Job | None:
    """Take the job for one run, or None: finished, not due, or another run holds it."""
    # A run whose lease expired is not taken over here: the resume task counts it as lost.
    taken = Job.objects.filter(
        pk=job_id, status=Job.Status.QUEUED, next_try_at__lte=now + dt.timedelta(seconds=1)
    ).update(status=Job.Status.RUNNING, lease_until=_lease_end(now), tries=F("tries") + 1)
    return Job.objects.get(pk=job_id) if taken else None


def job_leases_extend(job_ids: list[str], now: dt.datetime) -> None:
    Job.objects.filter(pk__in=job_ids, status=Job.Status.RUNNING).update(
        lease_until=_lease_end(now)
    )


def job_wait(job: Job, until: dt.datetime) -> None:
    """Refused for capacity before its deadline: back in line until ``until``."""
    Job.objects.filter(pk=job.pk, status=Job.Status.RUNNING).update(
        status=Job.Status.QUEUED, next_try_at=until, lease_until=None
    )


def job_finish(job: Job, status_code: int, response: dict[str, Any], now: dt.datetime) -> None:
    Job.objects.filter(pk=job.pk).exclude(status__in=Job.FINISHED).update(
        status=Job.Status.SUCCEEDED if status_code < 400 else Job.Status.FAILED,
        response_status=status_code,
        response=without_nul(response),  # the provider's answer may hold one
        finished_at=now,
        lease_until=None,
    )


def job_cancel(job: Job, now: dt.datetime) -> bool:
    """Cancel a job no run holds; False when it runs or has finished."""
    return bool(
        Job.objects.filter(pk=job.pk, status=Job.Status.QUEUED).update(
            status=Job.Status.CANCELLED, finished_at=now
        )
    )


def jobs_due(now: dt.datetime) -> list[str]:
    """Jobs a worker should be running now but perhaps is not, made ready to run again.

    A run whose lease expired died with its worker: the job goes back in line (or fails after
    ``MAX_LOST_RUNS``). A queued job long past its time lost its task message. A batch's
    lines are put back in line too, but not returned: its driver runs them, not a task each.
    """
    lost = Job.objects.filter(status=Job.Status.RUNNING, lease_until__lt=now)
    requeued: list[str] = []
    for job in lost:
        if job.lost_runs + 1 >= MAX_LOST_RUNS:
            job_finish(job, 500, _lost_response(job), now)
        elif (
            Job.objects.filter(pk=job.pk, status=Job.Status.RUNNING, lease_until__lt=now).update(
                status=Job.Status.QUEUED,
                lease_until=None,
                next_try_at=now,
                lost_runs=F("lost_runs") + 1,
            )
            and job.batch_id is None
        ):
            requeued.append(job.pk)  # run now, not one more resume interval later
    stale = now - dt.timedelta(seconds=settings.JOB_RESUME_INTERVAL)
    waiting = Job.objects.filter(
        status=Job.Status.QUEUED, next_try_at__lte=stale, batch__isnull=True
    )
    return requeued + [pk for pk in waiting.values_list("pk", flat=True) if pk not in requeued]


def jobs_forget(now: dt.datetime) -> int:
    """Delete finished jobs older than ``JOB_RETENTION_SECONDS``: a job keeps the caller's
    prompt and answer, which are not the platform's to hoard (the ledger keeps the usage)."""
    before = now - dt.timedelta(seconds=settings.JOB_RETENTION_SECONDS)
    deleted, _ = Job.objects.filter(status__in=Job.FINISHED, finished_at__lt=before).delete()
    return deleted


def jobs_open(now: dt.datetime) -> tuple[dict[tuple[int, str], int], float]:
    """Jobs not finished, counted by (tenant id, status), and how long the oldest queued one
    has waited since it was submitted (seconds; 0 when none waits): for /metrics."""
    open_jobs = Job.objects.exclude(status__in=Job.FINISHED)
    counts = {
        (row["tenant_id"], row["status"]): row["n"]
        for row in open_jobs.values("tenant_id", "status").annotate(n=Count("pk"))
    }
    oldest = open_jobs.filter(status=Job.Status.QUEUED).aggregate(at=Min("created_at"))["at"]
    return counts, max(0.0, (now - oldest).total_seconds()) if oldest else 0.0


def job_data(job: Job) -> dict[str, Any]:
    """What a caller sees of a job: its state and, once finished, the answer or the error."""
    return {
        "id": job.id,
        "object": "chat.completion.job",
        "status": job.status,
        "model": job.model,
        "workload": job.workload_class,
        "created_at": int(job.created_at.timestamp()),
        "deadline_at": int(job.deadline_at.timestamp()),
        "finished_at": int(job.finished_at.timestamp()) if job.finished_at else None,
        "tries": job.tries,
        "generation_id": job.generation_id,
        "response": job.response,
    }


def _lost_response(job: Job) -> dict[str, Any]:
    error = {
        "message": f"The job's run was lost {MAX_LOST_RUNS} times (its worker died); "
        "it is not tried again.",
        "type": "api_error",
        "code": "job_lost",
        "param": None,
        "reason": "job_lost",
    }
    return {"status_code": 500, "headers": {}, "body": {"error": error}}


def _lease_end(now: dt.datetime) -> dt.datetime:
    return now + dt.timedelta(seconds=settings.JOB_LEASE_SECONDS)


def _datetime(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC)
