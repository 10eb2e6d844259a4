"""One segment of the experiment, in one process: build the market, run the loop, collect.

The same provider behaviours, the same broker store and one router serve both arms: at each
block boundary the router's strategy switches (routing cost ↔ price only) while its live
statistics, the providers' limits, queues and incidents, and the broker's buckets carry on —
the interference between arms is the production experiment's, not an artefact.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from configfile import Config
from quotas.store.memory import MemoryReservationStore
from routing.core import Router, RoutingParameters
from simulator.model import Market
from simulator.switchback.admission import LEASE_S
from simulator.switchback.design import Design, Segment
from simulator.switchback.gateway import SimGateway
from simulator.switchback.loop import URGENT, EventLoop
from simulator.switchback.market import ORIGIN, market_build
from simulator.switchback.metrics import Recorder, SlotStats, median
from simulator.switchback.traffic import SimRequest, Traffic

SHARE_BIN_S = 900.0
PROGRESS_EVERY_S = 600.0
DRAIN_S = 900.0  # after the last arrival, answers still in flight finish
# The loop allocates millions of short-lived objects. At the default thresholds the cyclic
# collector runs every 700 allocations and often walks every live object: about 7 % of a run.
GC_THRESHOLDS = (100_000, 50, 100)


@dataclass
class SegmentResult:
    """Per block, per route (and ``"*"`` pooled): the block's measured sums and p50 TTFT."""

    index: int
    blocks: dict[int, dict[str, dict[str, Any]]]
    shares: dict[tuple[int, str], int]
    providers: dict[str, dict[str, Any]]
    requests: int
    wall_s: float
    strategy_blocks: dict[int, str] = field(default_factory=dict)
    # block → ``Recorder.tally``'s labels → count, measured requests only
    tallies: dict[int, dict[str, int]] = field(default_factory=dict)


def segment_run(
    config: Config,
    market: Market,
    design: Design,
    segment: Segment,
    *,
    scale: float,
    params: RoutingParameters | None = None,
    headroom_s: float = 1.0,
    learn_concurrency: bool = True,
    stream_reservation: tuple[str, str] | None = None,
    progress: Any = None,
) -> SegmentResult:
    """Simulate one segment and return its blocks' measurements (deterministic per seed).

    ``stream_reservation``: each arm's C10 mode (``max`` / ``increments``), switched with the
    router's strategy at each block boundary; None: the workload class's own, in both arms.
    """
    started = time.perf_counter()
    assert market.traffic is not None
    rng = random.Random(f"switchback-{design.seed}-{segment.index}")
    sim = market_build(
        config,
        market,
        scale=scale,
        rng=rng,
        params=params,
        headroom_s=headroom_s,
        learn_concurrency=learn_concurrency,
    )
    loop = EventLoop(ORIGIN + segment.start_s)
    router = Router(sim.models)
    store = MemoryReservationStore(
        clock=lambda: loop.now, lease_seconds=LEASE_S, retention_seconds=1.0
    )
    routes = sim.route_names
    route_index = {name: i for i, name in enumerate(routes)}
    n_routes = len(routes)
    recorder = Recorder(
        routes=routes,
        endpoints=sim.endpoint_ids,
        slots=design.blocks * n_routes,
        origin=ORIGIN,
        bin_s=SHARE_BIN_S,
    )
    orders = design.orders()
    measured_end = min(segment.end_block, 2 * design.pairs)
    counted = [0]

    def classify(request: SimRequest) -> int:
        counted[0] += 1
        t = request.arrival - ORIGIN
        block = int(t // design.block_s)
        if (
            request.pinned is not None
            or not segment.first_block <= block < measured_end
            or t - block * design.block_s < design.warmup_s
        ):
            return -1
        return block * n_routes + route_index[request.model]

    until = ORIGIN + segment.end_s
    traffic = Traffic(
        market.traffic,
        loop=loop,
        sink=lambda request: gateway.arrive(request),
        rng=random.Random(rng.getrandbits(64)),
        scale=scale,
        origin=ORIGIN,
        until=until,
        max_input_tokens=sim.max_input_tokens,
    )
    gateway = SimGateway(
        loop=loop,
        router=router,
        store=store,
        routes=sim.routes,
        workload=sim.workload,
        recorder=recorder,
        rng=random.Random(rng.getrandbits(64)),
        classify=classify,
        follow_up=traffic.follow_up,
    )
    strategies: dict[int, str] = {}

    def switch(block: int) -> None:
        arm = design.arm_of(block, orders)
        router.default_strategy = design.arms[arm]
        strategies[block] = router.default_strategy
        if stream_reservation is not None:
            gateway.reserve_streams(stream_reservation[arm])

    first_block = int(segment.start_s // design.block_s)
    for block in range(first_block, design.blocks + 1):
        at = ORIGIN + max(segment.start_s, block * design.block_s)
        loop.schedule(at, switch, block, priority=URGENT)
    if progress is not None:

        def report(_: object) -> None:
            progress[segment.index] = loop.now - ORIGIN - segment.start_s
            loop.schedule(loop.now + PROGRESS_EVERY_S, report, None)

        loop.schedule(loop.now, report, None)
    traffic.start()
    with _rare_collections():
        loop.run(until + DRAIN_S)
    if progress is not None:
        progress[segment.index] = segment.end_s - segment.start_s + DRAIN_S
    return SegmentResult(
        index=segment.index,
        blocks=_blocks(recorder.slots, routes, segment.first_block, measured_end),
        shares={(b, sim.endpoint_ids[e]): n for (b, e), n in recorder.shares.items()},
        providers={name: b.stats() for name, b in sim.behaviours.items()},
        requests=counted[0],
        wall_s=time.perf_counter() - started,
        strategy_blocks=strategies,
        tallies=_tallies(recorder.tallies, n_routes),
    )


def _tallies(counts: dict[tuple[int, str], int], n_routes: int) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for (slot, what), n in counts.items():
        block = out.setdefault(slot // n_routes, {})
        block[what] = block.get(what, 0) + n
    return out


@contextmanager
def _rare_collections() -> Iterator[None]:
    """Collect cycles rarely, and never walk the market built before the run (frozen).

    Results do not depend on it: nothing in the simulation uses weak references or finalizers.
    """
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _blocks(
    slots: list[SlotStats], routes: list[str], first: int, end: int
) -> dict[int, dict[str, dict[str, Any]]]:
    n = len(routes)
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for block in range(first, end):
        per_route = {name: slots[block * n + i] for i, name in enumerate(routes)}
        entry = {name: stats.as_dict() for name, stats in per_route.items()}
        pooled = {
            key: sum(e[key] for e in entry.values())
            for key in entry[routes[0]]
            if key != "ttft_p50"
        }
        ttfts = [t for stats in per_route.values() for t in stats.ttfts]
        pooled["ttft_p50"] = median(ttfts)
        entry["*"] = pooled
        out[block] = entry
    return out
