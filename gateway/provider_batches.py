"""E5: a Batch API batch sent whole to an endpoint's own batch API instead of line by line.

The rule (``path_rule``), decided once when a worker first takes the batch: the batch goes to
the provider when
  1. its metadata does not say ``switchyard_batch_path: lines`` (the caller's opt-out),
  2. its endpoint is ``/v1/chat/completions``,
  3. every line names the same model, which the batch's API key may use, and that model has an
     active endpoint whose provider offers a batch API (``batch_api``; the first in the
     model's order),
  4. no line asks for its own routing (``provider`` preferences, ``models`` fallbacks, a
     ``:floor`` / ``:nitro`` suffix), and every line needs only what the endpoint ``supports``
     and translates to its provider's wire (as a live call's would),
  5. the provider's turnaround (``batch_turnaround_seconds``) fits in what is left of the
     batch's ``completion_window``, and
  6. the tenant's spend buckets have room for the whole batch's estimate at the batch price;
otherwise the lines run here one by one, as before (``batch_runner.py``).

Sent there, the lines' jobs wait (queued, never taken by the line driver) while the driver
polls the provider (``provider_drive``, in the batch's Celery task: a driver that dies leaves
the batch's lease to expire and the resume task hands it to another, which polls the same
provider batch — the create went out with the batch's id as ``Idempotency-Key``, so a create
re-sent after a crash makes no second batch). When the provider's batch ends, each line's
answer is written into its job exactly once (a conditional update of a queued job), after its
ledger row (keyed by the line's generation id, so a second writer's row is dropped), priced at
the endpoint's prices less ``batch_discount``; the tenant's spend buckets are charged what the
written lines cost. A provider batch takes no reservation in the interactive buckets: the
provider runs it in a queue of its own.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import orjson
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from common.db import database_work
from common.errors import GatewayError
from gateway import batches, ledger
from gateway.batch_models import Batch
from gateway.call import DEFAULT_WORKLOAD, Call
from gateway.dispatch import caller_error
from gateway.doors.base import CanonicalRequest, Rendering
from gateway.doors.chat import CHAT
from gateway.intake import snapshot_current
from gateway.models import Job
from gateway.provider_batch_wire import (
    LineResult,
    ProviderBatchError,
    batch_cancel,
    batch_look,
    batch_results,
    batch_submit,
    line_json,
)
from gateway.providers import adapter_for
from gateway.providers.base import RequestNotSupported, StreamError, Usage
from gateway.records import generation_record, usage_cost
from gateway.snapshot import Snapshot
from quotas.broker import attempt_buckets, broker_get
from quotas.core.model import BucketSpec, Dimension
from routing.catalogue import EndpointEntry, ModelEntry
from routing.core.overrides import ProviderPreferences, model_suffix_split
from tenants.identity import Principal

log = logging.getLogger(__name__)

LINES, PROVIDER = "lines", "provider"
OPT_OUT_KEY = "switchyard_batch_path"  # metadata: "lines" keeps the line-by-line path
CHAT_URL = "/v1/chat/completions"
NO_PREFERENCES = ProviderPreferences()
# A line the provider's batch answered with one of these is not written: it runs here, line by
# line, where the pipeline retries it within the batch class's budget (as any live call).
RETRIED_HERE = frozenset({429, 500, 502, 503, 504, 529})


class _Heartbeat:
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


@dataclass(frozen=True)
class PathChoice:
    path: str  # LINES or PROVIDER
    why: str  # which clause decided, for the log


def path_rule(
    *,
    metadata: dict[str, Any] | None,
    url: str,
    models: set[str],
    endpoint: EndpointEntry | None,
    may_use: bool,
    routed: bool,
    translates: bool,
    window_left: float,
    spend_estimate: float,
    spend_room: float | None,
) -> PathChoice:
    """The rule of the module doc, clause by clause (``spend_room`` None: no spend budget)."""
    if (metadata or {}).get(OPT_OUT_KEY) == LINES:
        return PathChoice(LINES, "the caller asked for the line-by-line path")
    if url != CHAT_URL:
        return PathChoice(LINES, f"{url} lines are not sent to provider batch APIs")
    if len(models) != 1:
        return PathChoice(LINES, "its lines name more than one model")
    if endpoint is None or not may_use:
        return PathChoice(LINES, "no endpoint of its model offers a batch API")
    if routed:
        return PathChoice(LINES, "a line asks for its own routing (provider, models, a suffix)")
    if not translates:
        return PathChoice(
            LINES, f"a line needs more than {endpoint.key} supports, or does not translate"
        )
    if window_left < endpoint.batch_turnaround:
        return PathChoice(LINES, "the provider's turnaround does not fit the window left")
    if spend_room is not None and spend_estimate > spend_room:
        return PathChoice(LINES, "the tenant's spend budget has no room for the whole batch")
    return PathChoice(PROVIDER, f"sent to {endpoint.key}'s batch API")


def batch_price(endpoint: EndpointEntry) -> EndpointEntry:
    """The endpoint at its batch prices: ``batch_discount`` off each."""
    keep = 1.0 - endpoint.batch_discount
    return replace(
        endpoint,
        price_input=endpoint.price_input * keep,
        price_cached_input=endpoint.price_cached_input * keep,
        price_output=endpoint.price_output * keep,
    )


# -- deciding ----------------------------------------------------------------------------------


async def batch_path_decide(batch: Batch) -> str:
    """Decide the batch's path (once: a later driver keeps the first decision)."""
    snapshot = await snapshot_current()
    lines = await database_work(_lines_open)(batch)
    principal = snapshot.keys.principal_of(batch.api_key_id, now=time.time())
    choice, endpoint = await _choose(batch, snapshot, principal, lines)
    log.info("batch %s: %s", batch.id, choice.why)
    await database_work(_path_set)(batch.id, choice.path, endpoint.key if endpoint else "")
    return choice.path


async def _choose(
    batch: Batch, snapshot: Snapshot, principal: Principal | None, lines: list[Job]
) -> tuple[PathChoice, EndpointEntry | None]:
    models = {model_suffix_split(str(job.request.get("model", "")))[0] for job in lines}
    model = snapshot.catalogue.model_named(next(iter(models))) if len(models) == 1 else None
    endpoint = _batch_endpoint(model)
    routed, translates, estimate = False, True, 0.0
    if endpoint is not None:
        priced = batch_price(endpoint)
        heartbeat = _Heartbeat(batch.id)
        for job in lines:
            await heartbeat.beat()
            try:
                request = _parse(job)
                line_json(endpoint, request.body)
            except (GatewayError, RequestNotSupported):
                translates = False
                break
            if request.models or request.preferences != NO_PREFERENCES or ":" in request.model:
                routed = True
                break
            if not request.features <= endpoint.supports:
                translates = False
                break
            estimate += priced.cost(
                input_tokens=request.estimate.input_tokens,
                cached_input_tokens=0,
                output_tokens=request.estimate.max_output or endpoint.max_output,
            )
    room = None
    if endpoint is not None and model is not None and principal is not None and translates:
        room = await _spend_room(_spend_buckets(snapshot, principal, endpoint, model))
    choice = path_rule(
        metadata=batch.metadata,
        url=batch.endpoint,
        models=models,
        endpoint=endpoint,
        may_use=principal is not None and model is not None and principal.may_use(model.slug),
        routed=routed,
        translates=translates,
        window_left=(batch.expires_at - timezone.now()).total_seconds(),
        spend_estimate=estimate,
        spend_room=room,
    )
    return choice, endpoint if choice.path == PROVIDER else None


def _batch_endpoint(model: ModelEntry | None) -> EndpointEntry | None:
    if model is None:
        return None
    return next((e for e in model.endpoints if e.batch_api), None)


def _spend_buckets(
    snapshot: Snapshot, principal: Principal, endpoint: EndpointEntry, model: ModelEntry
) -> list[BucketSpec]:
    buckets = attempt_buckets(snapshot.quotas, principal, endpoint, model.id).buckets
    return [
        b.spec
        for b in buckets
        if b.tenant_side and b.spec.dimension is Dimension.SPEND and not b.spec.shadow
    ]


async def _spend_room(specs: list[BucketSpec]) -> float | None:
    if not specs:
        return None
    levels = await broker_get().store.levels(specs)
    return min(level.available for level in levels)


def _parse(job: Job) -> CanonicalRequest:
    return CHAT.parse(orjson.dumps(job.request), {})


# -- driving -----------------------------------------------------------------------------------


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
                await database_work(_path_set)(batch_id, LINES, "")
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
        await asyncio.sleep(settings.PROVIDER_BATCH_POLL_SECONDS)


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
    lines = await database_work(_lines_open)(batch)
    try:
        heartbeat = _Heartbeat(batch.id)
        wire = []
        for job in lines:
            await heartbeat.beat()
            wire.append((job.id, line_json(endpoint, _parse(job).body)))
        provider_batch_id = await batch_submit(endpoint, wire, key=batch.id)
    except (GatewayError, RequestNotSupported, ProviderBatchError) as error:
        status = error.status if isinstance(error, ProviderBatchError) else 400
        if not 400 <= status < 500 or status == 429:
            raise  # the provider is away or busy: the next poll tries again
        log.warning("batch %s: %s; its lines run here instead", batch.id, error)
        await database_work(_path_set)(batch.id, LINES, "")
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
        await database_work(_path_set)(batch_id, LINES, batch.provider_endpoint)
        return
    else:
        code, message = "", ""
    if code:
        await database_work(batches.batch_lines_stop)(batch, now, code=code, message=message)
    await database_work(batches.batch_finalize)(batch_id, now)


# -- reconciling -------------------------------------------------------------------------------


async def results_write(
    batch: Batch, snapshot: Snapshot, endpoint: EndpointEntry, results: list[LineResult]
) -> int:
    """Each run line's answer into its job, once; its ledger row first. Lines written."""
    jobs = {job.id: job for job in await database_work(_lines_open)(batch)}
    principal = snapshot.keys.principal_of(batch.api_key_id, now=time.time())
    model = snapshot.catalogue.models.get(endpoint.model_slug)
    workload = snapshot.quotas.workloads.get(settings.BATCH_WORKLOAD, DEFAULT_WORKLOAD)
    priced = batch_price(endpoint)
    answers: list[tuple[str, int, dict[str, Any], float]] = []
    heartbeat = _Heartbeat(batch.id)
    for result in results:
        await heartbeat.beat()
        job = jobs.get(result.custom_id)
        if job is None or not result.status or result.status in RETRIED_HERE:
            continue  # not this batch's, answered already, never run, or to run here
        call = Call(id=job.generation_id, created=job.created_at.timestamp(), door=CHAT)
        call.started -= time.time() - call.created  # its latency: from the batch's start
        call.principal, call.model, call.workload, call.endpoint = (
            principal,
            model,
            workload,
            priced,
        )
        call.attempts = 1
        call.explanation.append(f"provider_batch:{batch.provider_batch_id}")
        status, stored, usage, finish = await _answer(call, job, endpoint, priced, result)
        generation_record(call, status=status, usage=usage, finish_reason=finish)
        answers.append((job.id, status, stored, usage_cost(priced, usage) if usage else 0.0))
    await ledger.ledger_committed()
    written = await database_work(_answers_store)(answers, timezone.now())
    spent = sum(cost for job_id, _, _, cost in answers if job_id in written)
    if spent and principal is not None and model is not None:
        specs = _spend_buckets(snapshot, principal, endpoint, model)
        if specs:
            await broker_get().store.charge([(spec, spent) for spec in specs])
    return len(written)


async def _answer(
    call: Call, job: Job, endpoint: EndpointEntry, priced: EndpointEntry, result: LineResult
) -> tuple[int, dict[str, Any], Usage | None, str]:
    """The line's stored answer (status, {status_code, headers, body}), usage and finish."""
    adapter = adapter_for(endpoint.provider.protocol)
    if result.status < 400:
        try:
            completion = adapter.parse_completion(
                result.body,
                response_id=call.id,
                model=endpoint.model_slug,
                created=int(call.created),
            )
        except (StreamError, KeyError, TypeError, ValueError):
            result = LineResult(result.custom_id, 502, {})
        else:
            usage = completion.usage or Usage()
            how = Rendering(
                call_id=call.id,
                model=endpoint.model_slug,
                created=int(call.created),
                provider=endpoint.provider.name,
                cost=lambda u: usage_cost(priced, u),
            )
            body = await CHAT.answer(_parse(job), completion, usage, how)
            call.reason = "ok"
            stored = {"status_code": 200, "headers": {}, "body": body}
            return 200, stored, usage, completion.finish_reason
    classified = adapter.classify(result.status, {}, orjson.dumps(result.body))
    error = caller_error(endpoint.provider.name, result.status, classified, None)
    call.reason = error.reason
    stored = {"status_code": error.status, "headers": {}, "body": error.envelope()}
    return error.status, stored, None, ""


# -- the database's part -----------------------------------------------------------------------


def _lines_open(batch: Batch) -> list[Job]:
    return list(Job.objects.filter(batch=batch, status=Job.Status.QUEUED).order_by("line"))


def _path_set(batch_id: str, path: str, endpoint_key: str) -> None:
    """The batch's path; back on the line path, its counts are its lines' again."""
    Batch.objects.filter(pk=batch_id).update(
        path=path, provider_endpoint=endpoint_key, provider_counts=None
    )


def _provider_id_set(batch_id: str, provider_batch_id: str) -> None:
    Batch.objects.filter(pk=batch_id).update(provider_batch_id=provider_batch_id)


def _counts_set(batch_id: str, counts: dict[str, int]) -> None:
    Batch.objects.filter(pk=batch_id).update(provider_counts=counts)


def _answers_store(
    answers: list[tuple[str, int, dict[str, Any], float]], now: dt.datetime
) -> set[str]:
    """Each answer into its job if the job still waits for one: the ids written."""
    written: set[str] = set()
    with transaction.atomic():
        for job_id, status, stored, _ in answers:
            updated = Job.objects.filter(pk=job_id, status=Job.Status.QUEUED).update(
                status=Job.Status.SUCCEEDED if status < 400 else Job.Status.FAILED,
                response_status=status,
                response=ledger.without_nul(stored),
                finished_at=now,
                lease_until=None,
            )
            if updated:
                written.add(job_id)
    return written
