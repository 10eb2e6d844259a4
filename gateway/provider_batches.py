"""E5: a Batch API batch sent whole to an endpoint's own batch API, driven to its end.

Whether it goes there is ``provider_batch_rule.py``'s rule. Sent there, the lines' jobs wait
(queued, never taken by the line driver) while the batch's driver polls the provider
(``provider_drive``, in the batch's Celery task: a driver that dies leaves the batch's lease to
expire and the resume task hands it to another, which polls the same provider batch — the
create went out with the batch's id as ``Idempotency-Key``, so a create re-sent after a crash
makes no second batch). When the provider's batch ends its answers are reconciled
(``provider_batch_results.py``); what it did not answer runs here, line by line. A provider
batch takes no reservation in the interactive buckets: the provider runs it in a queue of its
own.
"""

from __future__ import annotations

import asyncio
import logging
import time

from django.conf import settings
from django.utils import timezone

from common.db import database_work
from common.errors import GatewayError
from gateway import batches
from gateway.batch_models import Batch
from gateway.intake import snapshot_current
from gateway.provider_batch_lines import Heartbeat, line_parse, lines_open, path_set
from gateway.provider_batch_results import results_write
from gateway.provider_batch_rule import LINES, PROVIDER, batch_path_decide
from gateway.provider_batch_wire import (
    ProviderBatchError,
    batch_cancel,
    batch_look,
    batch_results,
    batch_submit,
    line_json,
)
from gateway.providers.base import RequestNotSupported
from routing.catalogue import EndpointEntry

__all__ = ["LINES", "PROVIDER", "batch_path_decide", "provider_drive"]

log = logging.getLogger(__name__)


async def provider_drive(batch_id: str) -> None:
    """Send the batch to its provider (unless sent), poll it until it ends, write its lines'
    answers and end the batch — or hand what the provider did not answer back to the line
    path. Raises when the database is away (the caller logs it; the lease expires and another
    driver resumes here)."""
    renewed = time.monotonic()
    cancel_sent = False
    while True:
        if time.monotonic() - renewed > settings.JOB_LEASE_SECONDS / 3:
            await database_work(batches.batch_lease_extend)(batch_id, timezone.now())
            renewed = time.monotonic()
        batch = await database_work(batches.batch_status)(batch_id)
        if batch.status in Batch.FINISHED or batch.path != PROVIDER:
            return
        ending = batch.status == Batch.Status.CANCELLING or timezone.now() >= batch.expires_at
        snapshot = await snapshot_current()
        endpoint = snapshot.catalogue.endpoints.get(batch.provider_endpoint)
        if not batch.provider_batch_id and (ending or endpoint is None or not endpoint.batch_api):
            # Nothing sent yet: cancelled or expired lines end here; others run here instead.
            if ending:
                await _finish(batch_id)
            else:
                await database_work(path_set)(batch_id, LINES, "")
            return
        if endpoint is None:  # deactivated with the batch in flight: until it is back
            log.warning("batch %s: endpoint %s is gone", batch_id, batch.provider_endpoint)
            if ending:
                await _finish(batch_id)
                return
        else:
            try:
                if not batch.provider_batch_id:
                    await _submit(batch, endpoint)
                    continue
                if ending and not cancel_sent:
                    cancel_sent = await _cancel(endpoint, batch.provider_batch_id)
                state = await batch_look(endpoint, batch.provider_batch_id)
                if state.ended:
                    results = await batch_results(endpoint, batch.provider_batch_id)
                    await results_write(batch, snapshot, endpoint, results)
                    await _finish(batch_id)
                    return
                counts = {"completed": state.completed, "failed": state.failed}
                await database_work(_counts_set)(batch_id, counts)
            except ProviderBatchError as error:  # looked at again at the next poll
                log.warning("batch %s: %s", batch_id, error)
                if error.status == 404:  # the provider lost it: its lines run here (or end)
                    await _finish(batch_id)
                    return
        renewed = await _wait(batch_id, renewed)


async def _wait(batch_id: str, renewed: float) -> float:
    """Until the next poll, the batch's lease kept (a poll interval longer than the lease must
    not hand the batch to a second driver); when it was last renewed."""
    until = time.monotonic() + settings.PROVIDER_BATCH_POLL_SECONDS
    while (left := until - time.monotonic()) > 0:
        await asyncio.sleep(min(left, settings.JOB_LEASE_SECONDS / 3))
        if time.monotonic() - renewed > settings.JOB_LEASE_SECONDS / 3:
            await database_work(batches.batch_lease_extend)(batch_id, timezone.now())
            renewed = time.monotonic()
    return renewed


async def _cancel(endpoint: EndpointEntry, provider_batch_id: str) -> bool:
    """Forward a cancel (or the window's end); True once the provider took it or refused it
    for good (a 4xx: it has ended, or cannot be cancelled now) — either way, look next."""
    try:
        await batch_cancel(endpoint, provider_batch_id)
    except ProviderBatchError as error:
        if not 400 <= error.status < 500 or error.status == 429:
            raise
        log.info("provider batch %s: cancel refused (%s); looking at it", provider_batch_id, error)
    return True


async def _submit(batch: Batch, endpoint: EndpointEntry) -> None:
    """Create the provider batch; when the provider refuses it (a 4xx: it has no batch API
    after all, or will not take these lines) or a line no longer translates (the endpoint
    changed), the batch goes back to the line path."""
    lines = await database_work(lines_open)(batch)
    try:
        heartbeat = Heartbeat(batch.id)
        wire = []
        for job in lines:
            await heartbeat.beat()
            wire.append((job.id, line_json(endpoint, line_parse(job).body)))
        provider_batch_id = await batch_submit(endpoint, wire, key=batch.id)
    except (GatewayError, RequestNotSupported, ProviderBatchError) as error:
        status = error.status if isinstance(error, ProviderBatchError) else 400
        if not 400 <= status < 500 or status == 429:
            raise  # the provider is away or busy: the next poll tries again
        log.warning("batch %s: %s; its lines run here instead", batch.id, error)
        await database_work(path_set)(batch.id, LINES, "")
        return
    await database_work(_provider_id_set)(batch.id, provider_batch_id)
    log.info("batch %s: sent to %s as %s", batch.id, endpoint.key, provider_batch_id)


async def _finish(batch_id: str) -> None:
    """The provider's batch ended (or never went out): a cancelled or expired batch's unrun
    lines end unrun and the batch is finalized; in an open batch, lines the provider did not
    answer (or answered 429 / 5xx, which the line path would retry) run here."""
    now = timezone.now()
    batch = await database_work(batches.batch_status)(batch_id)
    if batch.status == Batch.Status.CANCELLING:
        code, message = "batch_cancelled", "The batch was cancelled first."
    elif now >= batch.expires_at:
        code, message = "batch_expired", "The batch's completion window ended before this ran."
    elif await database_work(batches.batch_lines_open)(batch):
        log.info("batch %s: the provider left lines unanswered; they run here", batch_id)
        await database_work(path_set)(batch_id, LINES, batch.provider_endpoint)
        return
    else:
        code, message = "", ""
    if code:
        await database_work(batches.batch_lines_stop)(batch, now, code=code, message=message)
    await database_work(batches.batch_finalize)(batch_id, now)


def _provider_id_set(batch_id: str, provider_batch_id: str) -> None:
    Batch.objects.filter(pk=batch_id).update(provider_batch_id=provider_batch_id)


def _counts_set(batch_id: str, counts: dict[str, int]) -> None:
    Batch.objects.filter(pk=batch_id).update(provider_counts=counts)
