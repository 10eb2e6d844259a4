"""Driving a batch (``gateway/batches.py``) in a Celery worker process, on idle capacity.

A task takes the batch's lease and hands its driver to the process's runs loop
(``job_runner.event_loop``); the driver keeps a few of the batch's lines running, each a job
run through the pipeline in the batch workload class — the scavenger: lowest weight in the fair
queue, so a waiting interactive request is granted first — and ends the batch when no line is
left. It renews the batch's lease; a worker that dies leaves it to expire, and the resume task
hands the batch to a live worker, whose driver finds each line as the dead one left it:
answered (kept), waiting (run), or running under a lease that expires (put back in line by
``jobs.jobs_due``, then sent again with the same Idempotency-Key).

How much it takes (the bound on what batch work costs interactive traffic): at most
``BATCH_CONCURRENCY`` lines per worker process hold a reservation at once, and the driver is a
delay-based scavenger, as LEDBAT (RFC 6817) is for background transfers: a line that waited in
the fair queue longer than ``BATCH_IDLE_WAIT_SECONDS``, was refused for capacity, or whose
grant left some bucket it used under ``BATCH_HEADROOM`` of its capacity, says the pool has
no idle capacity — or will not have for the next interactive burst — and the driver halves its
window (additive increase,
multiplicative decrease), and once at one line pauses — 0.25 s, doubling to
``MAX_PAUSE_SECONDS`` while its lines keep waiting — so the pool refills for the classes that
wait with it. So batch work holds at most ``BATCH_CONCURRENCY`` lines' reservations, of a
contended pool at most one line's in the gaps between pauses, and stops drawing a bucket down
once it holds less than ``BATCH_HEADROOM``: what is left is interactive traffic's burst room.

A slot pool (a concurrency bucket) needs more than that: a slot is held for a whole answer, so
an interactive burst that finds the batch in the slots waits until a batch line ends, and the
batch's own lines, granted quickly between bursts, see no wait to back off on (bench/results/
batch.md: 6 slots shared, p99 interactive wait 0 -> 47 ms). So each grant also tells the driver
how many slots others held beside its own lines; the driver keeps the recent peak of that,
forgotten one slot per ``SLOT_PEAK_FORGET_SECONDS``, and holds at most ``capacity - peak -
SLOT_RESERVE`` lines in the pool — none while others' peak fills it, one again once the peak
is forgotten far enough for a line to look again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from django.conf import settings
from django.utils import timezone

from common.db import database_work
from gateway import batches, job_runner, provider_batches
from gateway.batch_models import Batch
from gateway.job_runner import RunEnd
from gateway.models import Job

log = logging.getLogger(__name__)


MIN_PAUSE_SECONDS = 0.25
MAX_PAUSE_SECONDS = 8.0
SLOT_PEAK_FORGET_SECONDS = 10.0
SLOT_RESERVE = 1  # free beyond others' peak: the burst a little larger than any seen


class Window:
    """How many lines the driver keeps running: AIMD between 1 and ``BATCH_CONCURRENCY``, and a
    pause, doubling, while its lines wait at one line; in a slot pool, no more than others'
    recent peak leaves free (``now``: monotonic seconds)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.size = 1.0
        self.pause = 0.0
        self.paused_until = 0.0
        self._peaks: dict[str, tuple[float, float, float]] = {}  # pool: capacity, peak, at

    def ended(self, end: RunEnd | None, now: float, held: int = 1) -> None:
        """A line ended; ``held``: the driver's lines in flight with it, itself included."""
        for pool, capacity, free in end.slot_pools if end is not None else ():
            others = max(0.0, capacity - free - held)
            self._peaks[pool] = (capacity, max(others, self._peak(pool, now)), now)
        if (
            end is None
            or end.queue_wait > settings.BATCH_IDLE_WAIT_SECONDS
            or end.headroom < settings.BATCH_HEADROOM
        ):
            if self.size <= 1.0:
                self.pause = min(max(2 * self.pause, MIN_PAUSE_SECONDS), MAX_PAUSE_SECONDS)
                self.paused_until = now + self.pause
            self.size = max(1.0, self.size / 2)
        else:
            self.size = min(float(self.limit), self.size + 1.0 / self.size)
            self.pause /= 2  # forgotten gradually: the pool was contended not long ago

    def room(self, now: float) -> int:
        room = 0 if now < self.paused_until else int(self.size)
        for pool, (capacity, _, _) in self._peaks.items():
            left = int(capacity) - math.ceil(self._peak(pool, now)) - SLOT_RESERVE
            room = min(room, max(0, left))
        return room

    def _peak(self, pool: str, now: float) -> float:
        if pool not in self._peaks:
            return 0.0
        _, peak, at = self._peaks[pool]
        return max(0.0, peak - (now - at) / SLOT_PEAK_FORGET_SECONDS)


def batch_run(batch_id: str) -> str:
    """Start the batch's driver on this process's loop; what happened, for the log."""
    loop = job_runner.event_loop()
    batch = batches.batch_lease(batch_id, timezone.now())
    if batch is None:
        return "not open, or driven elsewhere"
    asyncio.run_coroutine_threadsafe(_drive(batch_id), loop)
    return "driving"


def batches_resume() -> int:
    """Hand every open batch that no live driver holds to a worker."""
    due = batches.batches_due(timezone.now())
    for batch_id in due:
        try:
            batches.batch_enqueue(batch_id)
        except Exception:  # the Celery broker: the next resume finds the batch again
            log.warning("could not queue batch %s now", batch_id, exc_info=True)
    return len(due)


async def _drive(batch_id: str) -> None:
    running: set[asyncio.Task[None]] = set()
    window = Window(settings.BATCH_CONCURRENCY)
    renewed = time.monotonic()
    try:
        batch = await database_work(batches.batch_start)(batch_id, timezone.now())
        if batch.status == Batch.Status.IN_PROGRESS and not batch.path:
            batch.path = await provider_batches.batch_path_decide(batch)
        if batch.path == provider_batches.PROVIDER:
            await provider_batches.provider_drive(batch_id)
            batch = await database_work(batches.batch_status)(batch_id)
            if batch.path == provider_batches.PROVIDER:  # ended there (or the driver stopped)
                return
            # Else what the provider did not answer (or never took) runs here, line by line.
        while True:
            if time.monotonic() - renewed > settings.JOB_LEASE_SECONDS / 3:
                await database_work(batches.batch_lease_extend)(batch_id, timezone.now())
                renewed = time.monotonic()
            batch = await database_work(batches.batch_status)(batch_id)
            if batch.status in Batch.FINISHED:
                return
            if not await _step(batch, running, window):
                break
            if running:
                await asyncio.wait(
                    running,
                    timeout=settings.BATCH_POLL_SECONDS,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            else:  # nothing runs: the lines wait for their time, or the driver pauses
                paused = window.paused_until - time.monotonic()
                await asyncio.sleep(
                    settings.BATCH_POLL_SECONDS if paused <= 0 else min(paused, 5.0) + 0.01
                )
        await database_work(batches.batch_finalize)(batch_id, timezone.now())
    except Exception:  # the database is away: the lease expires, the resume task retries
        log.exception("batch %s: its driver stopped", batch_id)
        return
    finally:
        if running:  # lines still running finish on their own; the next driver finds them
            await asyncio.wait(running)


async def _step(batch: Batch, running: set[asyncio.Task[None]], window: Window) -> bool:
    """Start what may start; False once no line of the batch is left to run."""
    now = timezone.now()
    if batch.status == Batch.Status.CANCELLING:
        await database_work(batches.batch_lines_stop)(
            batch, now, code="batch_cancelled", message="The batch was cancelled first."
        )
    elif now >= batch.expires_at:
        await database_work(batches.batch_lines_stop)(
            batch,
            now,
            code="batch_expired",
            message="The batch's completion window ended before this request ran.",
        )
    elif batch.status == Batch.Status.IN_PROGRESS:
        room = window.room(time.monotonic()) - len(running)
        for job in await database_work(batches.batch_lines_take)(batch, room, now):
            task = asyncio.create_task(_line(job, window, running))
            running.add(task)
            task.add_done_callback(running.discard)
    if running:
        return True
    return bool(await database_work(batches.batch_lines_open)(batch))


async def _line(job: Job, window: Window, running: set[asyncio.Task[None]]) -> None:
    end = await job_runner.line_run(job)
    window.ended(end, time.monotonic(), held=len(running))  # this task leaves it once done
