"""The router inside a gateway process: the pure core, with live stats shared through Redis.

Every process routes from its own in-memory view (``routing.core.Router``), updated at once by
its own attempts, so it reacts within the request that saw a failure (G11). Once a second,
off the request path, each process publishes its own decayed statistics — one hash field per
process in ``<prefix>:routing:ep:<endpoint>`` — and reads every process's back, merging them
with the core's ``stats_merge``. Nothing is read-modified-written: each process owns its field,
so there is no race to lose an update in; a dead process's field decays and is dropped.

The sync rides the round trip of an answer's ledger append (``sync_ride``, called by
``gateway.ledger``) when one comes after ``RIDE_SHARE`` of the interval, and goes on its own
only when none came by the interval's end: with answers one by one, each its own append, the
syncs were 2 of the ~7 round trips a second that were not an append (bench/results/redis.md).

Conversations pinned to an endpoint (G12) live in ``<prefix>:routing:sticky:<key>`` with the
provider's cache lifetime as TTL: read only for a conversation's later turns, written after
the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson
from django.conf import settings

from common import redis as sy_redis
from common.faultlog import faults
from routing.catalogue import Catalogue
from routing.core.parameters import RoutingParameters
from routing.core.planner import Plan, RoutingRequest
from routing.core.router import Router
from routing.core.stats import Outcome, State, stats_merge, traffic_merge
from routing.core.sticky import StickyState

log = logging.getLogger(__name__)

# A process whose statistics are this old has stopped publishing: its field is dropped.
STALE_SECONDS = 3600.0
# A sync may ride an append once this share of the interval has passed since the last one.
RIDE_SHARE = 0.8


class Boarded(NamedTuple):
    """A sync's commands added to a pipeline: what to read its replies as."""

    endpoint_keys: list[str]
    slugs: list[str]
    published: int  # the HSETs before the reads


class LiveRouter:
    def __init__(self, strategy: str) -> None:
        self.router = Router((), default_strategy=strategy, track_pending=True)
        self.process = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.version: int | None = None
        self.catalogue: Catalogue | None = None
        self._own: dict[str, State] = {}
        self._own_traffic: dict[str, State] = {}
        self._sync: asyncio.Task[None] | None = None
        self._synced_at = -math.inf  # when the last sync was sent (monotonic), ridden or not
        self._background: set[asyncio.Task[Any]] = set()
        self._rng = random.Random()

    def configure(self, version: int, catalogue: Catalogue) -> None:
        """Follow the configuration snapshot; start sharing statistics on first use."""
        if version != self.version:
            self.router.configure(m.routing for m in catalogue.models.values())
            self.version, self.catalogue = version, catalogue
        if self._sync is None or self._sync.done():
            self._synced_at = time.monotonic()  # the first one an interval after starting
            self._sync = asyncio.create_task(self._sync_forever())

    def plan(self, request: RoutingRequest) -> Plan:
        return self.router.plan(request, time.time(), self._rng)

    def observe(self, endpoint_key: str, outcome: Outcome) -> None:
        self.router.observe(endpoint_key, outcome, time.time())

    # --- stickiness (G12) ------------------------------------------------------------------

    async def sticky_get(self, conversation: str) -> StickyState | None:
        raw = await sy_redis.async_client().get(sy_redis.key("routing", "sticky", conversation))
        if not raw:
            return None
        data = orjson.loads(raw)
        return StickyState(data["endpoint"], data["last_used"], data["prefix_tokens"])

    def sticky_entry(
        self, conversation: str, state: StickyState, ttl: float
    ) -> tuple[str, bytes, int]:
        """The conversation's pin as a Redis key, value and time to live (ms). The gateway sets
        it in the round trip that appends the answer's ledger row (``ledger_write_later``), not
        in one of its own."""
        value = orjson.dumps(
            {
                "endpoint": state.endpoint_id,
                "last_used": state.last_used,
                "prefix_tokens": state.prefix_tokens,
            }
        )
        key = sy_redis.key("routing", "sticky", conversation)
        return key, value, max(1, int(ttl * 1000))

    def _later(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- sharing statistics between processes ----------------------------------------------

    async def _sync_forever(self) -> None:
        while True:
            interval = settings.ROUTING_SYNC_INTERVAL
            await asyncio.sleep(max(0.05 * interval, self._synced_at + interval - time.monotonic()))
            if time.monotonic() - self._synced_at < interval:
                continue  # an append took it meanwhile
            try:
                await self.sync()
            except Exception:  # Redis away: keep routing on this process's own view
                faults.warning(log, "routing:sync", "routing statistics not shared this round")

    async def sync(self) -> None:
        """Publish this process's statistics and load everyone's, merged: a round trip of its
        own."""
        pipe = sy_redis.async_client().pipeline(transaction=False)
        boarded = self._board(pipe)
        if boarded is not None:
            self._arrive(boarded, await pipe.execute())

    def sync_ride(self, pipe: Any) -> Callable[[list[Any]], None] | None:
        """If a sync is due, add it to ``pipe`` (another's round trip, not yet sent) and return
        what takes its replies, in order (a reply may be the command's error); else None."""
        if time.monotonic() - self._synced_at < RIDE_SHARE * settings.ROUTING_SYNC_INTERVAL:
            return None
        boarded = self._board(pipe)
        if boarded is None:
            return None
        return functools.partial(self._arrive, boarded)

    def _board(self, pipe: Any) -> Boarded | None:
        """Add the sync's commands to ``pipe``: this process's statistics written, everyone's
        read."""
        catalogue = self.catalogue
        if catalogue is None:
            return None
        self._synced_at = time.monotonic()
        deltas, traffic = self.router.stats_flush()
        for key, delta in deltas.items():
            self._own[key] = stats_merge(self._own.get(key, {}), delta, self._params(key))
        for slug, delta in traffic.items():
            self._own_traffic[slug] = traffic_merge(
                self._own_traffic.get(slug, {}), delta, self._model_params(slug)
            )
        for key, own in self._own.items():
            pipe.hset(sy_redis.key("routing", "ep", key), self.process, orjson.dumps(own))
        for slug, own in self._own_traffic.items():
            pipe.hset(sy_redis.key("routing", "model", slug), self.process, orjson.dumps(own))
        endpoint_keys = list(catalogue.endpoints)
        slugs = list(catalogue.models)
        for key in endpoint_keys:
            pipe.hgetall(sy_redis.key("routing", "ep", key))
        for slug in slugs:
            pipe.hgetall(sy_redis.key("routing", "model", slug))
        published = len(self._own) + len(self._own_traffic)
        return Boarded(endpoint_keys, slugs, published)

    def _arrive(self, boarded: Boarded, replies: list[Any]) -> None:
        """Load everyone's statistics, merged, from the replies to ``_board``'s commands (a
        ridden sync's may hold a command's error: then none is loaded this round)."""
        if any(isinstance(reply, Exception) for reply in replies):
            faults.warning(log, "routing:sync", "routing statistics not shared this round")
            return
        endpoint_keys, slugs = boarded.endpoint_keys, boarded.slugs
        replies = replies[boarded.published :]
        now = time.time()
        for key, fields in zip(endpoint_keys, replies[: len(endpoint_keys)], strict=True):
            params = self._params(key)
            merged = self._merged(
                sy_redis.key("routing", "ep", key),
                fields,
                now,
                lambda a, b, p=params: stats_merge(a, b, p),
            )
            if merged is not None:
                self.router.stats_load(key, merged)
        for slug, fields in zip(slugs, replies[len(endpoint_keys) :], strict=True):
            params = self._model_params(slug)
            merged = self._merged(
                sy_redis.key("routing", "model", slug),
                fields,
                now,
                lambda a, b, p=params: traffic_merge(a, b, p),
            )
            if merged is not None:
                self.router.traffic_load(slug, merged)

    def _merged(self, key: str, fields: dict[bytes, bytes], now: float, merge: Any) -> State | None:
        merged: State | None = None
        stale = []
        for process, raw in fields.items():
            state = orjson.loads(raw)
            if state.get("t", 0.0) < now - STALE_SECONDS:
                stale.append(process)
                continue
            merged = state if merged is None else merge(merged, state)
        if stale:
            self._later(sy_redis.async_client().hdel(key, *stale))
        return merged

    def _params(self, endpoint_key: str) -> RoutingParameters:
        model = self.router.model_of(endpoint_key)
        return model.params if model is not None else RoutingParameters()

    def _model_params(self, slug: str) -> RoutingParameters:
        model = self.router.models.get(slug)
        return model.params if model is not None else RoutingParameters()

    async def close(self) -> None:
        if self._sync is not None:
            self._sync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sync


_live: LiveRouter | None = None


def live_router() -> LiveRouter:
    """This process's router."""
    global _live
    if _live is None:
        _live = LiveRouter(settings.ROUTING_STRATEGY)
    return _live
