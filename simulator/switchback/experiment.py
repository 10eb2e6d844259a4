"""The whole switchback experiment: segments in parallel, then per-model and overall changes.

``experiment_run`` is what ``manage.py switchback`` calls. Its ``result`` is JSON-ready and a
pure function of the inputs (seed, days, scale, segments, arms): two runs give identical JSON.
Wall-clock figures are kept apart (``Run.wall_s``) so they never leak into the result.

With ``Options.compiled`` (a build of ``common.compiled_cores``) the segments run in
spawned workers that load the compiled cores before anything imports them; this process keeps
its pure-Python cores and sends the workers only plain data (the files' contents), never a
core object, whose class would differ on the other side.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from common.compiled_cores import worker_start as compiled_worker_start
from configfile import Config, config_parse, config_read
from routing.core import RoutingParameters
from simulator.model import ExperimentSpec, Market, MarketError, parse_market_text
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
    learn_concurrency: bool | None = None  # None: the gateway's LEARN_PROVIDER_CONCURRENCY
    compiled: str | None = None  # a compiled build's directory; None: the cores imported here
    # C10, per arm (new, old): "max" or "increments"; None: the workload class's, in both.
    stream_reservation: tuple[str, str] | None = None


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
    notes: list[str] = field(default_factory=list)  # what the run left out, for the reader


@dataclass(frozen=True)
class _Inputs:
    """Both files as read once: plain data (a YAML document, a text) any process can parse."""

    config_document: object
    market_text: str

    def parse(self) -> tuple[Config, Market]:
        return config_parse(self.config_document), parse_market_text(self.market_text)


def inputs_load(options: Options) -> tuple[Config, Market, Design]:
    """Parse both files and derive the design (block, warm-up, seed, duration)."""
    _, config, market, design = _load(options)
    return config, market, design


def _load(options: Options) -> tuple[_Inputs, Config, Market, Design]:
    inputs = _Inputs(
        config_read(options.config_path),
        Path(options.market_path).read_text(encoding="utf-8"),
    )
    try:
        config, market = inputs.parse()
    except MarketError as error:  # the market text was parsed without its file name
        raise MarketError(options.market_path, str(error)) from None
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
    return inputs, config, market, design


def experiment_run(options: Options, *, progress: ProgressCallback | None = None) -> Run:
    started = time.perf_counter()
    inputs, config, market, design = _load(options)
    count = options.segments or max(1, int(-(-design.duration_s // (4 * DAY))))
    segments = segments_plan(design, count)
    workers = options.workers or min(len(segments), mp.cpu_count())
    total = sum(s.end_s - s.start_s + DRAIN_S for s in segments)
    params = _params(options)
    settings = _SegmentSettings(
        options.scale,
        params,
        _headroom(options),
        _learn_concurrency(options),
        options.stream_reservation,
    )
    results: list[SegmentResult]
    jobs: list[tuple[Any, ...]]
    if options.compiled is not None:
        # spawn, even for one segment: this process already holds the pure-Python cores.
        pool = _Pool(mp.get_context("spawn"), workers, len(segments), options.compiled)
        jobs = [(_spawned_job, inputs, design, s, settings) for s in segments]
        results = pool.run(jobs, total, progress)
    elif workers <= 1 or len(segments) == 1:
        done = [0.0] * len(segments)
        results = []
        for segment in segments:
            tracker = _Tracker(done, total, progress)
            results.append(_segment_job(config, market, design, segment, settings, tracker))
    else:
        # fork: the workers inherit Django's settings and the parsed inputs as they are.
        pool = _Pool(mp.get_context("fork"), workers, len(segments), None)
        jobs = [(_segment_job, config, market, design, s, settings) for s in segments]
        results = pool.run(jobs, total, progress)
    results.sort(key=lambda r: r.index)
    blocks: dict[int, dict[str, dict[str, Any]]] = {}
    shares: dict[tuple[int, str], int] = {}
    arms_of_blocks: dict[int, str] = {}
    tallies: dict[int, dict[str, int]] = {}
    for r in results:
        blocks.update(r.blocks)
        tallies.update(r.tallies)
        for key, n in r.shares.items():
            shares[key] = shares.get(key, 0) + n
        arms_of_blocks.update(r.strategy_blocks)
    result = result_build(design, options, segments, blocks, sum(r.requests for r in results))
    result["tallies"] = _tallies_by_arm(design, tallies)
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
        notes=_left_out(config, market),
    )


def _left_out(config: Config, market: Market) -> list[str]:
    """Configured providers the market file does not describe: the run cannot use them."""
    described = {p.name for p in market.providers}
    return [
        f"provider {p.name} is in the configuration but not in the market file: "
        "its endpoints are left out"
        for p in config.providers
        if p.name not in described
    ]


def _tallies_by_arm(
    design: Design, tallies: dict[int, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Each arm's tallies over its measured blocks (``Recorder.tally``: what refused, which
    endpoint served how much)."""
    orders = design.orders()
    out: dict[str, dict[str, int]] = {"new": {}, "old": {}}
    for block, counts in tallies.items():
        side = out["new" if design.arm_of(block, orders) == 0 else "old"]
        for what, n in counts.items():
            side[what] = side.get(what, 0) + n
    return {arm: dict(sorted(c.items())) for arm, c in out.items()}


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
            "stream_reservation": None
            if options.stream_reservation is None
            else {"new": options.stream_reservation[0], "old": options.stream_reservation[1]},
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
    watch = threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True)
    watch.start()


def _exit_when_orphaned(parent: int) -> None:
    """End this worker when the command dies: else it waits on its queue forever."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


@dataclass(frozen=True)
class _SegmentSettings:
    scale: float
    params: dict[str, Any]  # RoutingParameters' fields: plain data crosses processes
    headroom_s: float
    learn_concurrency: bool
    stream_reservation: tuple[str, str] | None = None


def _headroom(options: Options) -> float:
    """The gateway's provider headroom (``PROVIDER_HEADROOM_SECONDS``) unless given."""
    if options.headroom_s is not None:
        return options.headroom_s
    from django.conf import settings

    return float(getattr(settings, "PROVIDER_HEADROOM_SECONDS", 1.0))


def _params(options: Options) -> dict[str, Any]:
    """The routing parameters beneath each model's own: given, or the gateway's defaults."""
    if options.params is not None:
        return dataclasses.asdict(options.params)
    from django.conf import settings

    return dataclasses.asdict(RoutingParameters(**getattr(settings, "ROUTING_PARAMETERS", {})))


def _learn_concurrency(options: Options) -> bool:
    """The gateway's ``LEARN_PROVIDER_CONCURRENCY`` unless given."""
    if options.learn_concurrency is not None:
        return options.learn_concurrency
    from django.conf import settings

    return bool(getattr(settings, "LEARN_PROVIDER_CONCURRENCY", True))


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
        params=RoutingParameters(**settings.params),
        headroom_s=settings.headroom_s,
        learn_concurrency=settings.learn_concurrency,
        stream_reservation=settings.stream_reservation,
        progress=_shared_progress if progress is None else progress,
    )


def _spawned_job(
    inputs: _Inputs, design: Design, segment: Segment, settings: _SegmentSettings
) -> SegmentResult:
    config, market = inputs.parse()  # here, with this process's (compiled) core classes
    return _segment_job(config, market, design, segment, settings)


class _Pool:
    """Segments in worker processes; progress comes back through a shared array."""

    def __init__(self, ctx: BaseContext, workers: int, segments: int, compiled: str | None):
        self.ctx, self.workers = ctx, workers
        self.shared = ctx.Array("d", segments, lock=False)
        self.compiled = compiled

    def run(
        self, jobs: list[tuple[Any, ...]], total: float, progress: ProgressCallback | None
    ) -> list[SegmentResult]:
        init: Callable[..., None]
        args: tuple[Any, ...]
        if self.compiled is None:
            init, args = _init_worker, (self.shared,)
        else:
            init = compiled_worker_start
            args = (self.compiled, f"{__name__}:_init_worker", self.shared)
        with ProcessPoolExecutor(
            max_workers=self.workers, mp_context=self.ctx, initializer=init, initargs=args
        ) as pool:
            futures: list[Future[SegmentResult]] = [pool.submit(*job) for job in jobs]
            while not all(f.done() for f in futures):
                time.sleep(0.5)
                if progress is not None:
                    progress(sum(self.shared), total)
            if progress is not None:
                progress(total, total)
            return [f.result() for f in futures]


__all__ = ["SHARE_BIN_S", "Options", "Run", "experiment_run", "inputs_load", "result_build"]
