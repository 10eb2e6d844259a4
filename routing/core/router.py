"""The router as one object: catalogue + live stats + tables, on whatever clock the caller has.

The switchback simulation keeps one on a simulated clock and calls only ``observe`` and
``plan``; ``default_strategy = "price_only"`` turns it into the old router for the experiment.

A gateway process keeps one with ``track_pending=True``: ``observe`` updates the local view at
once (so this process reacts within the request) and also a pending delta. Off the critical
path, ``stats_flush`` hands the deltas over to be merged into the shared copy (Redis hash, one
script doing ``stats_merge`` / ``traffic_merge``), and ``stats_load`` / ``traffic_load`` replace
the local view with the merged one read back. Caps are learned on the local view of the merged
load, so a flushed delta carries the view's cap fields (last writer wins by ``capt``).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from routing.core.capacity import CapacityView
from routing.core.catalogue import ModelConfig
from routing.core.cost import wait_seconds
from routing.core.planner import Plan, RoutingRequest, plan_build, request_price
from routing.core.scarcity import ScarcityView, ask
from routing.core.stats import (
    LAST_WRITER,
    Outcome,
    State,
    endpoint_capped,
    endpoint_observe,
    traffic_observe,
)
from routing.core.table import ModelTable, table_build


class Router:
    """Routing-cost router over a catalogue of models (pure: time and randomness are arguments)."""

    def __init__(
        self,
        models: Iterable[ModelConfig],
        *,
        default_strategy: str = "routing_cost",
        track_pending: bool = False,
    ) -> None:
        self.default_strategy = default_strategy
        self.track_pending = track_pending
        self._pending: dict[str, State] = {}
        self._pending_traffic: dict[str, State] = {}
        self.stats: dict[str, State] = {}  # endpoint id → flat stats
        self.traffic: dict[str, State] = {}  # model slug → flat traffic stats
        self._tables: dict[str, ModelTable] = {}
        self._dirty: set[str] = set()
        self.models: dict[str, ModelConfig] = {}
        self._model_of: dict[str, ModelConfig] = {}
        # What admission last heard of each endpoint's room (``routing.core.capacity``): its
        # caller tells it with ``capacity.full`` / ``capacity.room``; this process's own view.
        self.capacity = CapacityView()
        # The broker's grants and refusals of admission's fast tries, per pool
        # (``routing.core.scarcity``): told with ``scarcity_granted`` / ``scarcity_refused``.
        self.scarcity = ScarcityView()
        self.configure(models)

    def configure(self, models: Iterable[ModelConfig]) -> None:
        """Replace the catalogue (admin change); live stats of kept endpoints stay."""
        self.models = {m.slug: m for m in models}
        self._model_of = {e.id: m for m in self.models.values() for e in m.endpoints}
        self._tables.clear()

    def model_of(self, endpoint_id: str) -> ModelConfig | None:
        """The model an endpoint serves (None for an unknown endpoint)."""
        return self._model_of.get(endpoint_id)

    def observe(self, endpoint_id: str, outcome: Outcome, now: float) -> None:
        """Record one attempt's outcome (G2–G11); unknown endpoints are ignored."""
        model = self._model_of.get(endpoint_id)
        if model is None:
            return
        params = model.params
        endpoint_observe(self.stats.setdefault(endpoint_id, {}), outcome, now, params)
        traffic_observe(self.traffic.setdefault(model.slug, {}), outcome, now, params)
        if self.track_pending:
            endpoint_observe(self._pending.setdefault(endpoint_id, {}), outcome, now, params)
            traffic_observe(self._pending_traffic.setdefault(model.slug, {}), outcome, now, params)
        self._dirty.add(model.slug)

    def plan(self, request: RoutingRequest, now: float, rng: random.Random) -> Plan:
        """The ranked attempt plan for ``request`` at ``now`` (G1–G14)."""
        plan = plan_build(
            request,
            self.table,
            now=now,
            rng=rng,
            default_strategy=self.default_strategy,
            capacity=self.capacity,
            scarcity=self.scarcity,
        )
        for endpoint_id in plan.capped:  # the cap grows while it holds demand back (G10)
            model = self._model_of[endpoint_id]
            endpoint_capped(self.stats.setdefault(endpoint_id, {}), now, model.params)
            if self.track_pending:
                endpoint_capped(self._pending.setdefault(endpoint_id, {}), now, model.params)
        return plan

    def scarcity_granted(self, endpoint_id: str, pool: str, now: float) -> None:
        """Admission's fast try at ``endpoint_id`` (in provider pool ``pool``) was granted."""
        self.scarcity.granted(endpoint_id, pool, now)

    def scarcity_refused(
        self,
        endpoint_id: str,
        pool: str,
        now: float,
        buckets: Sequence[tuple[str, str]],
        *,
        input_tokens: float,
        output_tokens: float,
    ) -> None:
        """Admission's fast try at ``endpoint_id`` was refused for lack of capacity by
        ``buckets`` ((name, dimension); none: others wait in the pool's queue), for a request
        the plan priced at ``input_tokens`` / ``output_tokens``. What it asked of each bucket
        is priced here as the planner prices a candidate's ask."""
        asked: list[tuple[str, str, float]] = []
        model = self._model_of.get(endpoint_id)
        table = self.table(model.slug, now) if model is not None and buckets else None
        if table is not None:
            i = table.index[endpoint_id]
            price = request_price(table, i, input_tokens, output_tokens)
            seconds = wait_seconds(table.estimates[i], output_tokens)
            for name, dimension in buckets:
                amount = ask(
                    dimension,
                    input_tokens=input_tokens,
                    output_tokens=output_tokens,
                    price=price,
                    seconds=seconds,
                )
                asked.append((name, dimension, amount))
        self.scarcity.refused(endpoint_id, pool, now, asked)

    def table(self, slug: str, now: float) -> ModelTable | None:
        """The model's table, rebuilt when older than its refresh interval (or invalidated)."""
        table = self._tables.get(slug)
        if table is not None:
            age = now - table.built_at
            interval = table.params.refresh_interval_s
            if interval > 0.0:
                fresh = 0.0 <= age < interval
            else:  # rebuild on every new time or observation
                fresh = age == 0.0 and slug not in self._dirty
            if fresh:
                return table
        model = self.models.get(slug)
        if model is None:
            return None
        table = table_build(model, self.stats, self.traffic.get(slug, {}), now, previous=table)
        self._tables[slug] = table
        self._dirty.discard(slug)
        return table

    def stats_flush(self) -> tuple[dict[str, State], dict[str, State]]:
        """(endpoint deltas, model traffic deltas) observed since the last flush; resets them."""
        deltas, traffic = self._pending, self._pending_traffic
        self._pending, self._pending_traffic = {}, {}
        for endpoint_id, delta in deltas.items():
            view = self.stats.get(endpoint_id, {})
            for key in LAST_WRITER:  # the delta's own caps saw only this process's load
                if key in view:
                    delta[key] = view[key]
                else:
                    delta.pop(key, None)
        return deltas, traffic

    def traffic_load(self, slug: str, state: State) -> None:
        """Replace a model's traffic stats (the merged view read back from the shared copy)."""
        self.traffic[slug] = dict(state)
        self._dirty.add(slug)

    def stats_load(self, endpoint_id: str, state: State) -> None:
        """Replace an endpoint's stats (e.g. with the merged view read back from Redis)."""
        self.stats[endpoint_id] = dict(state)
        model = self._model_of.get(endpoint_id)
        if model is not None:
            self._dirty.add(model.slug)
