"""E5: whether a Batch API batch goes whole to an endpoint's own batch API (``path_rule``),
decided once when a worker first takes it, and the price it is reconciled at (``batch_price``).

The batch goes to the provider when
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
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from django.utils import timezone

from common.db import database_work
from common.errors import GatewayError
from gateway.batch_models import Batch
from gateway.intake import snapshot_current
from gateway.models import Job
from gateway.provider_batch_lines import Heartbeat, line_parse, lines_open, path_set
from gateway.provider_batch_wire import line_json
from gateway.providers.base import RequestNotSupported
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


async def batch_path_decide(batch: Batch) -> str:
    """Decide the batch's path (once: a later driver keeps the first decision)."""
    snapshot = await snapshot_current()
    lines = await database_work(lines_open)(batch)
    principal = snapshot.keys.principal_of(batch.api_key_id, now=time.time())
    choice, endpoint = await _choose(batch, snapshot, principal, lines)
    log.info("batch %s: %s", batch.id, choice.why)
    await database_work(path_set)(batch.id, choice.path, endpoint.key if endpoint else "")
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
        heartbeat = Heartbeat(batch.id)
        for job in lines:
            await heartbeat.beat()
            try:
                request = line_parse(job)
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
        room = await _spend_room(spend_buckets(snapshot, principal, endpoint, model))
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


def spend_buckets(
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
