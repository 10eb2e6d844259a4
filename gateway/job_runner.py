"""Running a deferred request (``gateway/jobs.py``) in a Celery worker.

The pipeline is async and keeps per-process async clients (Redis, the providers' HTTP pools),
so each worker process runs one event loop in a thread for its whole life and hands it one job
run at a time; the task's own thread keeps the job's lease alive while the run lasts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Coroutine
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from django.utils import timezone

from gateway import jobs, pipeline
from gateway.errors import CapacityRefused
from gateway.models import Job

log = logging.getLogger(__name__)

# A refused run waits at least this long before the next, at most the longest one (seconds):
# long enough not to spin, short enough that a freed pool is found soon.
WAIT_BOUNDS = (1.0, 300.0)

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def job_run(job_id: str) -> str:
    """One run of the job: its answer stored, or back in line; what happened, for the log."""
    now = timezone.now()
    job = jobs.job_lease(job_id, now)
    if job is None:
        return "not due"  # finished, waiting for a later try, or run elsewhere
    try_until = time.time() + settings.JOB_TRY_SECONDS
    last_try = try_until >= job.deadline_at.timestamp()
    try:
        result = _run(job, pipeline.job_attempt(job, try_until=try_until, last_try=last_try))
    except Exception:  # a bug: the job fails once, it does not loop
        log.exception("job %s failed in its run", job.id)
        jobs.job_finish(job, 500, _internal_error(), timezone.now())
        return "failed"
    if isinstance(result, CapacityRefused):
        wait = min(max(result.retry_after or 0.0, WAIT_BOUNDS[0]), WAIT_BOUNDS[1])
        jobs.job_wait(job, timezone.now() + dt.timedelta(seconds=wait))
        _later(job.id, wait)
        return "waiting"
    jobs.job_finish(job, result.status_code, _stored(result), timezone.now())
    return "finished"


def jobs_resume() -> int:
    """Queue again the jobs whose run died or whose task message was lost; forget old ones."""
    now = timezone.now()
    due = jobs.jobs_due(now)
    for job_id in due:
        _later(job_id, 0.0)
    jobs.jobs_forget(now)
    return len(due)


def _run(job: Job, coroutine: Coroutine[Any, Any, HttpResponse | CapacityRefused]) -> Any:
    future = asyncio.run_coroutine_threadsafe(coroutine, _event_loop())
    while True:
        try:
            return future.result(timeout=settings.JOB_LEASE_SECONDS / 3)
        except concurrent.futures.TimeoutError:
            jobs.job_lease_extend(job.id, timezone.now())


def _event_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None or not _loop.is_running():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="job-loop", daemon=True).start()
            _loop = loop
        return _loop


def _later(job_id: str, countdown: float) -> None:
    from gateway.tasks import job_run as task

    try:
        task.apply_async((job_id,), countdown=countdown)
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
