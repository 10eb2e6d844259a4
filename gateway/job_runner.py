"""Running deferred requests (``gateway/jobs.py``) in a Celery worker process.

A job mostly waits: for its turn in the broker's fair queue, then for the provider. So a task
does not hold its worker process for a run: it takes the job's lease, hands the run to the
process's event loop, and returns. One loop (a thread, for the process's life, with the
pipeline's async clients) holds up to ``JOB_CONCURRENCY`` runs at once, so the jobs of every
tenant wait side by side in the fair queue, which decides whose turn it is (D2) — not the order
of the Celery queue, where one tenant's thousand jobs would keep everyone else's behind them.
A tenant takes at most ``JOB_TENANT_SHARE`` of a process's runs; its next job waits in Celery's
queue a little while, so others get in.

The loop renews the leases of its runs; a process that dies leaves them to expire, and the
resume task queues those jobs again (``jobs.jobs_due``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from django.utils import timezone

from common.db import database_work
from gateway import jobs, pipeline
from gateway.call import Call
from gateway.errors import CapacityRefused
from gateway.models import Job
from quotas import recovery

log = logging.getLogger(__name__)

# A refused run waits at least this long before the next, at most the longest one (seconds):
# long enough not to spin, short enough that a freed pool is found soon.
WAIT_BOUNDS = (1.0, 300.0)
# A job that finds its process (or its tenant's share of it) full comes back after this (s).
BUSY_COUNTDOWN = 30.0


class _Runs:
    """The runs this process's loop holds: job id → tenant id (read and written on the loop)."""

    def __init__(self) -> None:
        self.tenants: dict[str, int] = {}
        self.per_tenant: Counter[int] = Counter()

    def room_for(self, tenant_id: int) -> bool:
        limit = settings.JOB_CONCURRENCY
        share = max(1, math.ceil(limit * settings.JOB_TENANT_SHARE))
        return len(self.tenants) < limit and self.per_tenant[tenant_id] < share

    def add(self, job: Job) -> None:
        self.tenants[job.id] = job.tenant_id
        self.per_tenant[job.tenant_id] += 1

    def remove(self, job: Job) -> None:
        if self.tenants.pop(job.id, None) is not None:
            self.per_tenant[job.tenant_id] -= 1


_runs = _Runs()
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def job_run(job_id: str) -> str:
    """Start one run of the job on this process's loop; what happened, for the log."""
    loop = event_loop()
    tenant = Job.objects.filter(pk=job_id).values_list("tenant_id", flat=True).first()
    if tenant is None:
        return "gone"
    if not _call_on(loop, _runs.room_for, tenant):
        _later(job_id, BUSY_COUNTDOWN)
        return "busy"
    job = jobs.job_lease(job_id, timezone.now())
    if job is None:
        return "not due"  # finished, waiting for a later try, or run elsewhere
    _call_on(loop, _runs.add, job)
    asyncio.run_coroutine_threadsafe(_run(job), loop)
    return "started"


async def line_run(job: Job) -> RunEnd | None:
    """Run one leased line of a batch on this loop (gateway/batch_runner.py): its lease renewed
    with the others, and back in line — for its batch's driver, not a task — when refused.
    How the answered run found the pools, or None when it did not end."""
    _runs.add(job)
    return await _run(job, requeue=False)


def jobs_resume() -> int:
    """Queue again the jobs whose run died or whose task message was lost; forget old ones."""
    now = timezone.now()
    due = jobs.jobs_due(now)
    for job_id in due:
        _later(job_id, 0.0)
    jobs.jobs_forget(now)
    return len(due)


@dataclass(frozen=True)
class RunEnd:
    """How an answered run found the pools: seconds it waited in the fair queue, the least
    share of capacity its buckets had left after its grant, and the slot pools it held a slot
    in as (bucket, capacity, slots left free)."""

    queue_wait: float
    headroom: float
    slot_pools: tuple[tuple[str, float, float], ...] = ()


async def _run(job: Job, *, requeue: bool = True) -> RunEnd | None:
    """The run: the answer stored, or the job back in line; never an exception left behind.
    Returns how the answered run found the pools, or None (refused, or it failed)."""
    seen: list[Call] = []
    try:
        try_until = time.time() + settings.JOB_TRY_SECONDS
        last_try = try_until >= job.deadline_at.timestamp()
        try:
            result = await pipeline.job_attempt(
                job, try_until=try_until, last_try=last_try, seen=seen.append
            )
        except Exception:  # a bug: the job fails once, it does not loop
            log.exception("job %s failed in its run", job.id)
            await database_work(jobs.job_finish)(job, 500, _internal_error(), timezone.now())
            return None
        if isinstance(result, CapacityRefused):
            wait = min(max(result.retry_after or 0.0, WAIT_BOUNDS[0]), WAIT_BOUNDS[1])
            until = timezone.now() + dt.timedelta(seconds=wait)
            await database_work(jobs.job_wait)(job, until)
            if requeue:
                await database_work(_later)(job.id, wait)
            return None
        await database_work(jobs.job_finish)(
            job, result.status_code, _stored(result), timezone.now()
        )
        if not seen:
            return None
        return RunEnd(seen[0].queue_wait, seen[0].headroom, seen[0].slot_pools)
    except Exception:  # the database is away: the lease expires, the resume task retries
        log.exception("job %s: its run could not be recorded", job.id)
        return None
    finally:
        _runs.remove(job)


async def _renew_leases() -> None:
    """Keep this process's runs leased while they last (a dead process stops renewing)."""
    while True:
        await asyncio.sleep(settings.JOB_LEASE_SECONDS / 3)
        if _runs.tenants:
            try:
                await database_work(jobs.job_leases_extend)(list(_runs.tenants), timezone.now())
            except Exception:
                log.exception("renewing the leases of running jobs failed")


def event_loop() -> asyncio.AbstractEventLoop:
    """This process's runs' loop (started on first use), for jobs and batches alike."""
    global _loop
    with _loop_lock:
        if _loop is None or not _loop.is_running():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="job-loop", daemon=True).start()
            asyncio.run_coroutine_threadsafe(_renew_leases(), loop)
            # The loop holds this process's reservations: it heartbeats them (quotas/recovery.py).
            asyncio.run_coroutine_threadsafe(recovery.members_join("worker"), loop)
            _loop = loop
        return _loop


def _call_on(loop: asyncio.AbstractEventLoop, function: Any, *args: Any) -> Any:
    """Run a quick function on the loop's thread (the runs' book is the loop's alone)."""

    async def call() -> Any:
        return function(*args)

    return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout=10)


def _later(job_id: str, countdown: float) -> None:
    try:
        jobs.job_enqueue(job_id, countdown)
    except Exception:  # the Celery broker: the resume task finds the job later
        log.warning("could not queue job %s again now", job_id, exc_info=True)


def _stored(response: HttpResponse) -> dict[str, Any]:
    """The answer as the job keeps it: status, Switchyard's headers, the JSON body."""
    headers = {name.lower(): value for name, value in response.items()}
    headers.pop("content-type", None)
    return {
        "status_code": response.status_code,
        "headers": headers,
        "body": json.loads(response.content),
    }


def _internal_error() -> dict[str, Any]:
    error = {
        "message": "Switchyard failed while running this job; it is not tried again.",
        "type": "api_error",
        "code": "internal_error",
        "param": None,
        "reason": "internal_error",
    }
    return {"status_code": 500, "headers": {}, "body": {"error": error}}
