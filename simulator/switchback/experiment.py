"""The whole switchback experiment: segments in parallel, then per-model and overall changes.

``experiment_run`` is what ``manage.py switchback`` calls. Its ``result`` is JSON-ready and a
pure function of the inputs (seed, days, scale, segments, arms): two runs give identical JSON.
Wall-clock figures are kept apart (``Run.wall_s``) so they never leak into the result.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.configfile import Config, config_parse, config_read
from routing.core import RoutingParameters
from simulator.model import ExperimentSpec, Market, parse_market_text
from simulator.switchback.analysis import changes_estimate
from simulator.switchback.design import DAY, NEW, OLD, Design, Segment, segments_plan
from simulator.switchback.market import SwitchbackError
from simulator.switchback.runner import DRAIN_S, SHARE_BIN_S, SegmentResult, segment_run

ProgressCallback = Callable[[float, float], None]  # (simulated seconds done, total)


@dataclass(frozen=True)
class Options:
    config_path: str
    market_path: str
    days: float | None = None  # None: the traffic section's duration
    scale: float = 1.0
    arms: tuple[str, str] = (NEW, OLD)
    segments: int | None = None  # None: one per started 4 days (the week: 2)
    workers: int | None = None  # None: min(segments, CPUs)
    seed: int | None = None  # None: experiment.seed
    params: RoutingParameters | None = None
    headroom_s: float | None = None  # None: the gateway's PROVIDER_HEADROOM_SECONDS


@dataclass
class Run:
    """A finished experiment: the JSON result and what the report and plots need."""

    result: dict[str, Any]
    design: Design
    segments: list[Segment]
    blocks: dict[int, dict[str, dict[str, Any]]]
    shares: dict[tuple[int, str], int]
    arms_of_blocks: dict[int, str]
    wall_s: float
    requests: int
    segment_wall_s: list[float] = field(default_factory=list)


def inputs_load(options: Options) -> tuple[Config, Market, Design]:
    """Parse both files and derive the design (block, warm-up, seed, duration)."""
    config = config_parse(config_read(options.config_path))
    market = parse_market_text(Path(options.market_path).read_text(encoding="utf-8"))
    if market.traffic is None:
        raise SwitchbackError(f"{options.market_path}: no traffic section")
    spec = market.experiment or ExperimentSpec(block=3 * 3600.0, warmup=3600.0, seed=0)
    duration = options.days * DAY if options.days is not None else market.traffic.duration
    seed = spec.seed if options.seed is None else options.seed
    design = Design(spec.block, spec.warmup, duration, seed, options.arms)
    if design.pairs < 1:
        raise SwitchbackError(
            f"the run ({duration / 3600:g} h) is shorter than one pair of blocks "
            f"({2 * spec.block / 3600:g} h)"
        )
    return config, market, design


def experiment_run(options: Options, *, progress: ProgressCallback | None = None) -> Run:
    started = time.perf_counter()
    config, market, design = inputs_load(options)
    count = options.segments or max(1, int(-(-design.duration_s // (4 * DAY))))
    segments = segments_plan(design, count)
    workers = options.workers or min(len(segments), mp.cpu_count())
    total = sum(s.end_s - s.start_s + DRAIN_S for s in segments)
    settings = _SegmentSettings(options.scale, options.params, _headroom(options))
    results: list[SegmentResult]
    if workers <= 1 or len(segments) == 1:
        done = [0.0] * len(segments)
        results = []
        for segment in segments:
            tracker = _Tracker(done, total, progress)
            results.append(_segment_job(config, market, design, segment, settings, tracker))
    else:
        results = _parallel(config, market, design, segments, settings, workers, total, progress)
    results.sort(key=lambda r: r.index)
    blocks: dict[int, dict[str, dict[str, Any]]] = {}
    shares: dict[tuple[int, str], int] = {}
    arms_of_blocks: dict[int, str] = {}
    for r in results:
        blocks.update(r.blocks)
        for key, n in r.shares.items():
            shares[key] = shares.get(key, 0) + n
        arms_of_blocks.update(r.strategy_blocks)
    result = result_build(design, options, segments, blocks, sum(r.requests for r in results))
    return Run(
        result=result,
        design=design,
        segments=segments,
        blocks=blocks,
        shares=shares,
        arms_of_blocks={
            b: design.arms[design.arm_of(b, design.orders())] for b in range(design.blocks)
        },
        wall_s=time.perf_counter() - started,
        requests=sum(r.requests for r in results),
        segment_wall_s=[r.wall_s for r in results],
    )


def result_build(
    design: Design,
    options: Options,
    segments: list[Segment],
    blocks: dict[int, dict[str, dict[str, Any]]],
    requests: int,
) -> dict[str, Any]:
    """The JSON result: overall and per-model changes with CIs, and the experiment's facts."""
    orders = design.orders()
    pairs = []
    for pair in range(design.pairs):
        a, b = 2 * pair, 2 * pair + 1
        if a not in blocks or b not in blocks:
            continue
        new_block, old_block = (a, b) if design.arm_of(a, orders) == 0 else (b, a)
        pairs.append((blocks[new_block], blocks[old_block]))
    routes = [name for name in (pairs[0][0] if pairs else {}) if name != "*"]
    overall = changes_estimate([(n["*"], o["*"]) for n, o in pairs], seed=design.seed)
    per_model = {
        route: changes_estimate([(n[route], o[route]) for n, o in pairs], seed=design.seed)
        for route in routes
    }
    return {
        "overall": overall,
        "per_model": per_model,
        "experiment": {
            "arms": {"new": design.arms[0], "old": design.arms[1]},
            "seed": design.seed,
            "days": design.duration_s / DAY,
            "scale": options.scale,
            "block_s": design.block_s,
            "warmup_s": design.warmup_s,
            "pairs": len(pairs),
            "new_first": orders,
            "segments": [
                {"start_s": s.start_s, "first_block": s.first_block, "end_block": s.end_block}
                for s in segments
            ],
            "requests": requests,
        },
    }


class _Tracker:
    """Collects one segment's progress (simulated seconds) for a sequential run."""

    def __init__(self, done: list[float], total: float, callback: ProgressCallback | None):
        self.done, self.total, self.callback = done, total, callback

    def __setitem__(self, index: int, value: float) -> None:
        self.done[index] = value
        if self.callback is not None:
            self.callback(sum(self.done), self.total)


_shared_progress: Any = None


def _init_worker(progress: Any) -> None:
    global _shared_progress
    _shared_progress = progress


@dataclass(frozen=True)
class _SegmentSettings:
    scale: float
    params: RoutingParameters | None
    headroom_s: float


def _headroom(options: Options) -> float:
    """The gateway's provider headroom (``PROVIDER_HEADROOM_SECONDS``) unless given."""
    if options.headroom_s is not None:
        return options.headroom_s
    from django.conf import settings

    return float(getattr(settings, "PROVIDER_HEADROOM_SECONDS", 1.0))


def _segment_job(
    config: Config,
    market: Market,
    design: Design,
    segment: Segment,
    settings: _SegmentSettings,
    progress: Any = None,
) -> SegmentResult:
    return segment_run(
        config,
        market,
        design,
        segment,
        scale=settings.scale,
        params=settings.params,
        headroom_s=settings.headroom_s,
        progress=_shared_progress if progress is None else progress,
    )


def _parallel(
    config: Config,
    market: Market,
    design: Design,
    segments: list[Segment],
    settings: _SegmentSettings,
    workers: int,
    total: float,
    progress: ProgressCallback | None,
) -> list[SegmentResult]:
    # fork: the workers inherit Django's settings and the parsed inputs as they are.
    ctx = mp.get_context("fork")
    shared = ctx.Array("d", len(segments), lock=False)
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(shared,)
    ) as pool:
        futures: list[Future[SegmentResult]] = [
            pool.submit(_segment_job, config, market, design, s, settings) for s in segments
        ]
        while not all(f.done() for f in futures):
            time.sleep(0.5)
            if progress is not None:
                progress(sum(shared), total)
        if progress is not None:
            progress(total, total)
        return [f.result() for f in futures]


__all__ = ["SHARE_BIN_S", "Options", "Run", "experiment_run", "inputs_load", "result_build"]
