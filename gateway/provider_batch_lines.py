"""E5: a batch's lines as the provider path reads them — the open ones, each parsed as the chat
door parses a request — and the heartbeat that long work over them keeps."""

from __future__ import annotations

import asyncio
import time

import orjson
from django.conf import settings
from django.utils import timezone

from common.db import database_work
from gateway import batches
from gateway.batch_models import Batch
from gateway.doors.base import CanonicalRequest
from gateway.doors.chat import CHAT
from gateway.models import Job


def lines_open(batch: Batch) -> list[Job]:
    """The batch's lines still waiting for an answer, in file order."""
    return list(Job.objects.filter(batch=batch, status=Job.Status.QUEUED).order_by("line"))


def line_parse(job: Job) -> CanonicalRequest:
    """The line as the chat door reads a request (raises its ``GatewayError`` when bad)."""
    return CHAT.parse(orjson.dumps(job.request), {})


def path_set(batch_id: str, path: str, endpoint_key: str) -> None:
    """The batch's path; back on the line path, its counts are its lines' again."""
    Batch.objects.filter(pk=batch_id).update(
        path=path, provider_endpoint=endpoint_key, provider_counts=None
    )


class Heartbeat:
    """Long work over a batch's lines on the worker's shared loop: every ``EVERY`` lines it
    lets the loop's other runs go on, and it keeps the batch's lease while it lasts (a lease
    that ran out would hand the batch to a second driver)."""

    EVERY = 250

    def __init__(self, batch_id: str) -> None:
        self.batch_id = batch_id
        self.count = 0
        self.renewed = time.monotonic()

    async def beat(self) -> None:
        self.count += 1
        if self.count % self.EVERY:
            return
        await asyncio.sleep(0)
        if time.monotonic() - self.renewed > settings.JOB_LEASE_SECONDS / 3:
            await database_work(batches.batch_lease_extend)(self.batch_id, timezone.now())
            self.renewed = time.monotonic()
