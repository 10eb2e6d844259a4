"""Routing decision time in process (SPEC G1–G14): one model, 10 endpoints, live stats.

Run: .venv/bin/python bench/routing_decision.py [--write]
With --write the table goes to bench/results/routing_decision.md. Target: p50 ≤ 50 µs for the
default strategy and a full attempt plan.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from routing.core import (  # noqa: E402
    EndpointConfig,
    ModelConfig,
    Outcome,
    Router,
    RoutingRequest,
    StickyState,
    provider_preferences_parse,
)
from routing.core.stats import endpoint_observe  # noqa: E402
from routing.core.table import table_build  # noqa: E402

N_ENDPOINTS = 10
NOW = 3600.0


def build_router() -> tuple[Router, list[EndpointConfig]]:
    """Ten endpoints with an hour of simulated traffic: spread speeds, errors, a few 429s."""
    rng = random.Random(1)
    endpoints = [
        EndpointConfig(
            id=f"acme/chat@p{i}",
            provider=f"p{i}",
            model="acme/chat",
            price_input=0.2 + 0.07 * i,
            price_cached_input=0.02 + 0.01 * i,
            price_output=1.0 + 0.25 * ((i * 7) % 10),
            context_window=131072 if i % 3 else 65536,
            max_output=8192,
            supports=frozenset({"tools", "stream"} if i % 2 else {"stream"}),
        )
        for i in range(N_ENDPOINTS)
    ]
    router = Router([ModelConfig("acme/chat", tuple(endpoints))])
    t = NOW - 600.0
    while t < NOW:
        t += rng.expovariate(20.0)
        i = rng.randrange(N_ENDPOINTS)
        e = endpoints[i]
        roll = rng.random()
        if roll < 0.01 * (i % 4):
            outcome = Outcome("fault", latency_s=0.4)
        elif roll < 0.01 * (i % 4) + (0.15 if i in (2, 5) else 0.005):
            outcome = Outcome("rate_limited", latency_s=0.2)
        else:
            ttft = 0.2 + 0.1 * i * rng.random()
            tokens_out = int(rng.lognormvariate(5.8, 0.8))
            outcome = Outcome(
                "ok",
                latency_s=ttft + tokens_out / (40.0 + 12.0 * (i % 5)),
                ttft_s=ttft,
                input_tokens=int(rng.lognormvariate(8.0, 1.2)),
                cached_input_tokens=int(rng.random() * 2000),
                output_tokens=tokens_out,
                output_checked=i % 2 == 1 and rng.random() < 0.3,
                output_bad=rng.random() < 0.02,
            )
        router.observe(e.id, outcome, t)
    return router, endpoints


def timed(fn: Callable[[], object], n: int) -> list[float]:
    """Microseconds per call, one measurement per call."""
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        start = clock()
        fn()
        out.append((clock() - start) / 1000.0)
    return out


def summary(samples: list[float]) -> tuple[float, float, float, float]:
    ordered = sorted(samples)
    n = len(ordered)
    return (
        ordered[n // 2],
        ordered[int(n * 0.9)],
        ordered[int(n * 0.99)],
        statistics.fmean(ordered),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=50000)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    router, endpoints = build_router()
    table = router.table("acme/chat", NOW)
    assert table is not None
    rng = random.Random(7)
    typical = RoutingRequest("acme/chat")
    sized = RoutingRequest(
        "acme/chat", input_tokens=12000, max_tokens=1024, features=frozenset({"tools"})
    )
    sticky = RoutingRequest(
        "acme/chat", sticky=StickyState(endpoints[3].id, NOW - 30.0, prefix_tokens=8000)
    )
    prefs = RoutingRequest(
        "acme/chat",
        provider=provider_preferences_parse(
            {"ignore": ["p9"], "max_price": {"prompt": 0.7}, "preferred_max_latency": 0.8}
        ),
    )
    sorted_req = RoutingRequest("acme/chat:nitro")
    # Issue 17's capacity terms: the broker refused every fast try at p2 for the last minute
    # (its shadow price and the cost guard's "full" test are live), and p7 is full until later.
    scarce, _ = build_router()
    for k in range(200):
        t = NOW - 60.0 + 0.3 * k
        scarce.scarcity_refused(
            endpoints[2].id,
            "provider:p2",
            t,
            [("provider:p2:output_tokens:1m", "output_tokens")],
            input_tokens=3000,
            output_tokens=300,
        )
        scarce.scarcity_granted(endpoints[5].id, "provider:p5", t)
    scarce.capacity.full(endpoints[7].id, NOW + 5.0, NOW)
    legacy = Router([ModelConfig("acme/chat", tuple(endpoints))], default_strategy="price_only")
    legacy.stats = router.stats
    state = dict(router.stats[endpoints[0].id])
    ok = Outcome("ok", latency_s=3.0, ttft_s=0.4, input_tokens=3000, output_tokens=300)
    clock = [NOW]
    model = router.models["acme/chat"]
    traffic = router.traffic["acme/chat"]

    def observe() -> None:
        clock[0] += 0.001
        endpoint_observe(state, ok, clock[0], table.params)

    cases: list[tuple[str, Callable[[], object], int]] = [
        (
            "plan, default strategy, typical request (G2 estimate)",
            lambda: router.plan(typical, NOW, rng),
            args.n,
        ),
        (
            "plan, default strategy, request with input/max_tokens/tools (5 tool-capable ranked)",
            lambda: router.plan(sized, NOW, rng),
            args.n,
        ),
        (
            "plan, default strategy, sticky conversation",
            lambda: router.plan(sticky, NOW, rng),
            args.n,
        ),
        (
            "plan, provider object (ignore, max_price, preferred_max_latency)",
            lambda: router.plan(prefs, NOW, rng),
            args.n,
        ),
        (
            "plan, default strategy, capacity short (shadow price at p2, p7 full)",
            lambda: scarce.plan(typical, NOW, rng),
            args.n,
        ),
        ("plan, :nitro (throughput sort)", lambda: router.plan(sorted_req, NOW, rng), args.n),
        ("plan, price-only router", lambda: legacy.plan(typical, NOW, rng), args.n),
        ("observe one outcome (flat stats update)", observe, args.n),
        (
            "table rebuild (once per refresh interval, per model)",
            lambda: table_build(model, router.stats, traffic, NOW),
            args.n // 20,
        ),
    ]
    for _, fn, _ in cases:  # warm up
        for _ in range(2000):
            fn()
    rows = []
    for name, fn, n in cases:
        p50, p90, p99, mean = summary(timed(fn, n))
        rows.append((name, n, p50, p90, p99, mean))
    binding = sum(1 for lo, hi in zip(table.lower, table.upper, strict=True) if hi < 1.0)
    lines = [
        "# Routing decision time (bench/routing_decision.py)",
        "",
        f"One model, {N_ENDPOINTS} endpoints, 10 minutes of simulated stats (spread speeds, "
        f"fault rates 0–3 %, two endpoints 429-ing 15 % with learned caps: {binding} caps "
        "binding), table fresh (rebuilt once per refresh interval, measured separately). "
        "Times per call in µs, `time.perf_counter_ns` around each call, after 2,000 warm-up "
        "calls.",
        "",
        f"Machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()}.",
        "",
        "| case | calls | p50 µs | p90 µs | p99 µs | mean µs |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, n, p50, p90, p99, mean in rows:
        lines.append(f"| {name} | {n} | {p50:.1f} | {p90:.1f} | {p99:.1f} | {mean:.1f} |")
    lines += [
        "",
        "Target: p50 ≤ 50 µs for the default strategy and a full plan (all 10 endpoints ranked).",
        "",
        "Why it is cheap: everything that depends only on stats and config (priors, λ, the "
        "three cost coefficients per endpoint, breaker, backoff, floors, cap bounds) is in a "
        "per-model table rebuilt at most once per `refresh_interval_s` (1 s); a request does "
        "three multiply-adds per endpoint, one `exp` for its band weight, an active-set fill "
        "for floor and cap (one or two passes), and one random number per endpoint for the "
        "whole attempt order (exponential clocks), with no per-endpoint objects created.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        out = ROOT / "bench" / "results" / "routing_decision.md"
        out.write_text(text)
        print(f"written to {out}")


if __name__ == "__main__":
    main()
