"""Render bench/results/anchors.md from a ``bench/anchors`` run folder (markdown on stdout).

    python bench/anchors_report.py bench/results/anchors/run-YYYYmmdd-HHMMSS

Reads the harness's ``results.csv`` and ``memory.csv`` (run_all.sh), ``redis.json`` (the Redis
phase, bench/anchors_redis.py) and ``summary.md`` (report.py), and writes issue 19's table for
switchyard-2w against litellm-2w with ratios, the Redis figures, the acceptance lines marked
met / not met, then the harness's summary verbatim. Means over repetitions; every figure says
how it was measured.
"""

# ruff: noqa: E501  (markdown table rows and sentences are clearer kept whole)
from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def above_idle(r: dict) -> str:
    """Redis CPU per request less its idle over the same span (runs before 2026-12-05: —)."""
    v = r.get("redis_cpu_above_idle_us_per_req")
    return "—" if v is None else f"{v:,.0f}"


def mode(r: dict, connections: int) -> str:
    kind = "streaming" if r["stream"] else "non-streaming"
    if r.get("connections", connections) != connections:
        kind = f"{kind}, {r['connections']} connections"
    kind = f"{kind}, 0.5 s between requests" if r.get("think_s") else kind
    return f"{kind}, pair {r['rep']}" if "rep" in r and r["case"] in PAIRED else kind


def split(r: dict) -> str:
    """Each worker's share of the gateway's CPU in a case (runs before 2026-12-06: —)."""
    shares = r.get("worker_cpu_shares")
    return "—" if not shares else " / ".join(f"{s * 100:.0f}" for s in shares)


PAIRED = ("ttft500", "ttft0_paced")  # run as pairs over shared connections since 2026-12-06


SY, LL, FLOOR, DIRECT = "switchyard-2w", "litellm-2w", "pyfwd", "direct"


def main() -> None:
    run = Path(sys.argv[1])
    rows = list(csv.DictReader((run / "results.csv").open()))
    memory = list(csv.DictReader((run / "memory.csv").open()))
    redis = json.loads((run / "redis.json").read_text()) if (run / "redis.json").exists() else []
    # the Python floor under the Redis phase's two loads (runs since 2026-12-06)
    floor = json.loads((run / "floor.json").read_text()) if (run / "floor.json").exists() else []
    machine = (run / "machine.txt").read_text() if (run / "machine.txt").exists() else ""

    def reps(label: str, case: str, key: str) -> list[float]:
        out = []
        for r in rows:
            if r["label"] == label and r["case"] == case and r.get(key, "") not in ("", None):
                out.append(float(r[key]))
        return out

    def mean(label: str, case: str, key: str) -> float | None:
        v = reps(label, case, key)
        return statistics.mean(v) if v else None

    def added_p50(label: str) -> float | None:
        t, d = mean(label, "c1", "p50_ms"), mean(DIRECT, "c1", "p50_ms")
        return t - d if t is not None and d is not None else None

    def peak_worker(label: str) -> float | None:
        v = [float(m["max_process_peak_rss_mib"]) for m in memory if m["label"] == label]
        return max(v) if v else None

    def fmt(v: float | None, nd: int = 2) -> str:
        return "—" if v is None else f"{v:,.{nd}f}"

    def cell(label: str, case: str, key: str, nd: int) -> str:
        v = reps(label, case, key)
        if not v:
            return "—"
        each = " / ".join(fmt(x, nd) for x in v)
        return fmt(statistics.mean(v), nd) + (f" ({each})" if len(v) > 1 else "")

    def ratio(a: float | None, b: float | None, times: bool = False) -> str:
        if a is None or not b:
            return "—"
        return f"{a / b:.1f}×" if times else f"{a / b:.2f}"

    nreps = max((int(r["rep"]) for r in rows), default=0)
    out: list[str] = []
    p = out.append
    p("# Switchyard against LiteLLM, side by side (issue 19)\n")
    p(
        f"`bench/anchors` (run folder `{run.name}`, {nreps} repetition(s) interleaved): the shared "
        'harness `../shared/bench-anchors/run_all.sh` with `TARGETS="direct pyfwd litellm-2w '
        'switchyard-2w"` in a loopback-only network namespace, then a Redis phase on a fresh '
        "switchyard-2w (below). Both gateways have 2 uvicorn workers and forward to the same mock "
        "upstream (2 ports × 2 processes); load generator, mock and gateway share the machine's 2 "
        "cores. The machine was shared with other work: read ratios, not absolute figures.\n"
    )
    p("```")
    p(machine.rstrip())
    p("```\n")
    notes = (
        run / "notes.md"
    )  # hand-written remarks on this run (load, what differed), kept on re-render
    if notes.exists():
        p(notes.read_text().rstrip() + "\n")

    sy_p50, ll_p50 = added_p50(SY), added_p50(LL)
    sy64, ll64 = mean(SY, "c64", "rps"), mean(LL, "c64", "rps")
    sys64, lls64 = mean(SY, "c64_stream", "rps"), mean(LL, "c64_stream", "rps")
    sy_cpu, ll_cpu = mean(SY, "c16", "gw_cpu_ms_per_req"), mean(LL, "c16", "gw_cpu_ms_per_req")
    sy_rss, ll_rss = peak_worker(SY), peak_worker(LL)
    r0 = next((r for r in redis if r["case"] == "ttft0"), None)
    slow = [r for r in redis if r["case"] == "ttft500"]  # one a pair (one row before 2026-12-06)
    paced = [r for r in redis if r["case"] == "ttft0_paced"]
    r64 = next((r for r in redis if r["case"] == "ttft500_c64"), None)
    conns = redis[0].get("connections", 16) if redis else 16  # REDIS_CONNECTIONS
    lone = redis[0].get("lone_append_cpu_us") if redis else None  # runs since 2026-12-06

    p("## The issue's table\n")
    p(
        "Values: mean over repetitions (each repetition in brackets). Ratio = Switchyard / LiteLLM.\n"
    )
    p("| | Switchyard | LiteLLM | ratio | pyfwd (Python floor) | how measured |")
    p("|---|---:|---:|---:|---:|---|")
    p(
        f"| added p50 at 1 connection (ms) | {fmt(sy_p50)} | {fmt(ll_p50)} | {ratio(sy_p50, ll_p50)} "
        f"| {fmt(added_p50(FLOOR))} | `c1` (wrk, 1 connection, 15 s): p50 of the target − p50 of "
        "`direct` (the mock called directly) in the same run |"
    )
    p(
        f"| requests/s at 64 connections | {cell(SY, 'c64', 'rps', 0)} | {cell(LL, 'c64', 'rps', 0)} "
        f"| {ratio(sy64, ll64, True)} | {cell(FLOOR, 'c64', 'rps', 0)} | `c64`: wrk, 64 "
        "connections, closed loop, upstream TTFT 0 |"
    )
    p(
        f"| streamed requests/s at 64 | {cell(SY, 'c64_stream', 'rps', 0)} | "
        f"{cell(LL, 'c64_stream', 'rps', 0)} | {ratio(sys64, lls64, True)} | "
        f"{cell(FLOOR, 'c64_stream', 'rps', 0)} | `c64_stream`: `stream: true` + usage chunk, 20 "
        "SSE events, whole stream |"
    )
    p(
        f"| gateway CPU per request at c16 (ms) | {cell(SY, 'c16', 'gw_cpu_ms_per_req', 2)} | "
        f"{cell(LL, 'c16', 'gw_cpu_ms_per_req', 2)} | {ratio(sy_cpu, ll_cpu)} | "
        f"{cell(FLOOR, 'c16', 'gw_cpu_ms_per_req', 2)} | CPU seconds of the gateway's process tree "
        "(`/proc`, `procstat.py`) over the 15 s window / requests |"
    )
    p(
        f"| Redis CPU per request at c16 (ms) | {cell(SY, 'c16', 'aux_cpu_ms_per_req', 3)} | — | | | "
        "CPU seconds of Switchyard's redis-server process (`aux CPU` in run.sh) over the c16 window "
        "/ requests |"
    )
    if r0:
        p(
            f"| Redis time per request (µs), upstream 0 | {fmt(r0['redis_usec_per_req'], 0)} | — | "
            "| | Redis phase: `INFO commandstats` `usec` of client-sent commands / requests "
            f"(exactly N requests, {conns} connections) |"
        )
        p(
            f"| Redis commands per request, upstream 0 | {fmt(r0['commands_per_req'], 1)} | — | "
            f"| | Redis phase: `calls` of every command, those inside scripts included "
            f"({fmt(r0['evalsha_per_req'], 2)} script calls: FCALL) |"
        )
        p(
            f"| bytes to Redis per request, upstream 0 | {fmt(r0['bytes_in_per_req'], 0)} | — | | | "
            "Redis phase: `total_net_input_bytes` / requests |"
        )
    p(
        f"| peak RSS per worker (MiB) | {fmt(sy_rss, 0)} | {fmt(ll_rss, 0)} | {ratio(sy_rss, ll_rss)} "
        f"| {fmt(peak_worker(FLOOR), 0)} | largest single process's VmHWM in the gateway's tree after "
        "the suite (max over repetitions) |"
    )
    sy_tot = [float(m["sum_peak_rss_mib"]) for m in memory if m["label"] == SY]
    ll_tot = [float(m["sum_peak_rss_mib"]) for m in memory if m["label"] == LL]
    if sy_tot and ll_tot:
        p(
            f"| peak RSS, whole tree (MiB) | {fmt(max(sy_tot), 0)} | {fmt(max(ll_tot), 0)} | "
            f"{ratio(max(sy_tot), max(ll_tot))} | | sum of VmHWM over the supervisor and its 2 "
            "workers (Switchyard's Redis not included) |"
        )

    if redis:
        p("\n## Redis per proxied request (the Redis phase)\n")
        p(
            "After `run_all.sh`, in a fresh loopback-only namespace: the same mock upstream, a fresh "
            "empty redis-server and a fresh switchyard-2w (the same start script and "
            "`config-bench.yaml`: model `demo-model` over two provider accounts, buckets on key, "
            "app, team, tenant and providers, limits × 10⁶ so nothing binds, no Celery worker). "
            "`bench/anchors_redis.py`: first, per kind of case, a MONITOR sample of 8 requests "
            "(which share of each command's calls a client sent rather than a script); then per "
            "case 64 warm-up requests on its connections; `CONFIG RESETSTAT`; exactly N requests "
            f"over {conns} connections with the harness's request "
            "body (aiohttp; every request completes); 1 s to settle; counters / N. Redis µs = "
            "`usec` of client-sent commands (a script's inner commands are inside its FCALL); "
            "Redis CPU = the server's `used_cpu_user + used_cpu_sys` (event loop and socket I/O "
            "included: an upper bound), and above its idle = less what the same Redis used "
            "with no client, measured for 5 s before the gateway started, over as long; "
            "commands = `calls` of every command, script-inner "
            "included; bytes = `total_net_input_bytes`; gateway CPU = uvicorn's process tree "
            "over the same span (the last 1 s idle included), and each worker's share of it. "
            "The 0.5 s case and the case at its rate with an instant upstream (0.5 s between a "
            "connection's requests) run as pairs, each pair over one set of connections (so both "
            "are served by the same workers: uvicorn's accept splits new connections unevenly), "
            "the connections' first requests spread over 0.5 s (so both cases' requests arrive "
            "spread, not in bunches that share wake-ups and ledger appends). "
            'Upstream "500 ms" is the mock with '
            "TTFT 500 ms (`/__mock/config`), not the provider simulator.\n"
        )
        p(
            "| upstream | mode | requests | errors | Redis µs / req | Redis CPU µs / req | above "
            "its idle | commands / req | FCALL / req | µs / FCALL | bytes to Redis / req | bytes "
            "from Redis / req | gateway CPU ms / req | workers' CPU shares % |"
        )
        p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in redis:
            p(
                f"| {r['upstream_ttft_ms']} ms | {mode(r, conns)} | "
                f"{r['requests']} | {r['errors']} | {fmt(r['redis_usec_per_req'], 0)} | "
                f"{fmt(r['redis_cpu_us_per_req'], 0)} | {above_idle(r)} | "
                f"{fmt(r['commands_per_req'], 1)} | "
                f"{fmt(r['evalsha_per_req'], 2)} | {fmt(r['usec_per_evalsha'], 0)} | "
                f"{fmt(r['bytes_in_per_req'], 0)} | {fmt(r['bytes_out_per_req'], 0)} | "
                f"{fmt(r['gateway_cpu_ms_per_req'], 2)} | {split(r)} |"
            )
        if redis[0].get("redis_idle_cpu_ms_per_s") is not None:
            p(f"\nRedis idle, before the gateway started: "
              f"{fmt(redis[0]['redis_idle_cpu_ms_per_s'], 2)} ms of CPU a second.")  # fmt: skip
        if len(floor) == 2:
            f0, fp = floor
            p(
                f"\nThe Python floor (`py_forwarder.py`, one process, the same mock) under the same "
                f"two loads after the gateway's cases: {fmt(f0['cpu_ms_per_req'], 3)} ms of CPU a "
                f"request closed-loop at upstream 0 ({fmt(f0['requests'] / f0['seconds'], 0)} "
                f"requests/s), {fmt(fp['cpu_ms_per_req'], 3)} ms at the paced rate "
                f"({fmt(fp['requests'] / fp['seconds'], 0)} requests/s, spread; errors "
                f"{f0['errors']} / {fp['errors']}): on this machine requests that come one by one "
                f"cost even the floor {fmt(fp['cpu_ms_per_req'] / f0['cpu_ms_per_req'], 1)}× "
                "what they cost it under load."
            )
        if lone:
            p(
                f"\nOne answer's ledger append alone (I2: in Redis before the answer goes out), "
                f"before the gateway started: a round trip of its shape (RPUSH of a 600-byte "
                f"record, SET NX GET) {fmt(2 * conns, 0)} times a second, one by one, costs that "
                f"Redis **{fmt(lone, 0)} µs** of CPU each, its idle included "
                f"({fmt(lone - redis[0]['redis_idle_cpu_ms_per_s'] * 1000 / (2 * conns), 0)} "
                "above it): the least a request costs it at the 0.5 s cases' rate when answers "
                "come one by one (`redis_counters.lone_append_cpu`)."
            )
        if r0:
            top = sorted(r0["breakdown"].items(), key=lambda kv: -kv[1][0])[:12]
            p("\nUpstream 0, non-streaming, by command (calls and usec per request, script-inner "
              "commands included and also inside FCALL's usec): "
              + ", ".join(f"`{n}` {c:.1f} / {u:.0f} µs" for n, (c, u) in top) + ".")  # fmt: skip

    p("\n## Acceptance (issue 19), this run\n")

    def line(ok: bool | None, text: str) -> None:
        mark = "not measured" if ok is None else ("**met**" if ok else "**not met**")
        p(f"- {mark}: {text}")

    def median(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    def each(rows: list[dict], key: str, digits: int = 0) -> str:
        return "" if len(rows) < 2 else f" (pairs: {', '.join(fmt(r[key], digits) for r in rows)})"

    if r0 and slow:
        us5 = median(slow, "redis_cpu_us_per_req")
        idle5 = (
            statistics.median(r["redis_cpu_above_idle_us_per_req"] for r in slow)
            if all(r.get("redis_cpu_above_idle_us_per_req") is not None for r in slow)
            else None
        )
        at64 = (
            f"; at 64 connections (0.5 s, {fmt(r64['requests'] / r64['seconds'], 0)} requests/s) "
            f"{fmt(r64['redis_cpu_us_per_req'], 0)} µs, above idle {above_idle(r64)}"
            if r64
            else ""
        )
        line(
            max(r0["redis_cpu_us_per_req"], us5) <= 120,
            f"Redis CPU per proxied request ≤ 120 µs at upstream 0 and 0.5 s — Redis CPU "
            f"{fmt(r0['redis_cpu_us_per_req'], 0)} / {fmt(us5, 0)} µs"
            f"{each(slow, 'redis_cpu_us_per_req')}, above Redis's own idle {above_idle(r0)} / "
            f"{'—' if idle5 is None else fmt(idle5, 0)} µs, Redis time (commandstats) "
            f"{fmt(r0['redis_usec_per_req'], 0)} / {fmt(median(slow, 'redis_usec_per_req'), 0)} µs "
            f"(0 / 500 ms TTFT at {conns} connections, mock, not the simulator"
            f"{'; 0.5 s: the median' if len(slow) > 1 else ''}){at64}"
            + (f"; a lone ledger append alone costs {fmt(lone, 0)} µs at that rate" if lone else "")
            + ".",
        )
        worst_b = max(r["bytes_in_per_req"] for r in (r0, *slow))
        line(
            worst_b <= 2048,
            f"bytes sent to Redis ≤ 2 KB per request at 0 and 0.5 s — {fmt(r0['bytes_in_per_req'], 0)}"
            f" / {fmt(max(r['bytes_in_per_req'] for r in slow), 0)} bytes (the largest; 2 KB read "
            "as 2,048).",
        )
        g0, g5 = r0["gateway_cpu_ms_per_req"], median(slow, "gateway_cpu_ms_per_req")
        closed = (
            f"closed loop at {conns} connections {fmt(g0)} → {fmt(g5)} ms ({(g5 / g0 - 1) * 100:+.0f} "
            f"%), where the 0.5 s case also runs at {fmt(slow[0]['requests'] / slow[0]['seconds'], 0)} "
            f"rather than {fmt(r0['requests'] / r0['seconds'], 0)} requests/s"
        )
        if paced:
            by_rep = (
                {r["rep"]: r for r in paced} if len(paced) > 1 else {slow[0].get("rep"): paced[0]}
            )
            pairs = [(by_rep[r.get("rep")], r) for r in slow]
            growth = [
                s["gateway_cpu_ms_per_req"] / q["gateway_cpu_ms_per_req"] - 1 for q, s in pairs
            ]
            told = "; ".join(
                f"{fmt(q['gateway_cpu_ms_per_req'])} → {fmt(s['gateway_cpu_ms_per_req'])} ms "
                f"({g * 100:+.0f} %{'' if split(s) == '—' else f', workers {split(s)} %'})"
                for (q, s), g in zip(pairs, growth, strict=True)
            )
            mid = statistics.median(growth)
            floor_told = (
                f" (the Python floor between the same two loads: {fmt(floor[0]['cpu_ms_per_req'], 3)}"
                f" → {fmt(floor[1]['cpu_ms_per_req'], 3)} ms, "
                f"{fmt(floor[1]['cpu_ms_per_req'] / floor[0]['cpu_ms_per_req'], 1)}×)"
                if len(floor) == 2
                else ""
            )
            shared = ", each pair over one set of connections" if "rep" in paced[0] else ""
            line(
                mid <= 0.2,
                f"gateway CPU per request at 0.5 s no more than 20 % above 0 — at the same rate "
                f"({fmt(paced[0]['requests'] / paced[0]['seconds'], 0)} requests/s, upstream 0 with "
                f"0.5 s between a connection's requests){shared}: "
                f"{told}; median **{mid * 100:+.0f} %**; {closed}{floor_told}.",
            )
        else:
            line(
                g5 <= 1.2 * g0,
                f"gateway CPU per request at 0.5 s no more than 20 % above 0 — {closed}.",
            )
    else:
        line(
            None,
            "Redis CPU ≤ 120 µs, bytes ≤ 2 KB, gateway CPU at 0.5 s ≤ 1.2× at 0 (no redis.json)",
        )
    line(
        sy_cpu is not None and sy_cpu <= 1.2,
        f"gateway CPU per request ≤ 1.2 ms at c16 — {fmt(sy_cpu)} ms.",
    )
    line(
        None if sy_p50 is None or not ll_p50 else sy_p50 <= ll_p50 / 6,
        f"added p50 at 1 connection ≤ 1/6 of LiteLLM's — {fmt(sy_p50)} vs {fmt(ll_p50)} ms "
        f"(ratio {ratio(sy_p50, ll_p50)}; 1/6 = 0.17).",
    )
    line(
        None if sy64 is None or not ll64 else sy64 >= 10 * ll64,
        f"requests/s at 64 connections ≥ 10× LiteLLM's (2 workers each) — {fmt(sy64, 0)} vs "
        f"{fmt(ll64, 0)} ({ratio(sy64, ll64, True)}).",
    )
    line(
        None if sys64 is None or not lls64 else sys64 >= 15 * lls64,
        f"streaming ≥ 15× — {fmt(sys64, 0)} vs {fmt(lls64, 0)} streams/s ({ratio(sys64, lls64, True)}).",
    )
    line(
        sy_rss is not None and sy_rss <= 125,
        f"peak RSS per worker ≤ 125 MiB — {fmt(sy_rss, 0)} MiB.",
    )
    slow = ROOT / "bench" / "results" / "slow_streams.json"
    if slow.exists():
        ss = json.loads(slow.read_text())
        line(
            ss["ok"] == ss["streams"]
            and not ss["errors"]
            and ss["leases_left"] == ss["concurrency_holders_left"] == 0,
            f"{ss['streams']:,} concurrent slow streams held by 2 workers — `bench/slow_streams.py` "
            f"({ss['date']}, its own run): {ss['ok']:,} complete, errors {ss['errors'] or 'none'}, "
            f"leases left {ss['leases_left']}, holders left {ss['concurrency_holders_left']}; "
            "`bench/results/slow_streams.md`.",
        )
    else:
        line(
            None, "2,000 concurrent slow streams held by 2 workers: bench/slow_streams.py not run."
        )
    line(
        None, "no behaviour change (whole suite, switchback intervals): not part of this benchmark."
    )

    summary = run / "summary.md"
    if summary.exists():
        p(f"\n## The harness's summary (`{run.name}/summary.md`, report.py)\n")
        p(summary.read_text().replace("\n### ", "\n### ").rstrip())
    print("\n".join(out))


if __name__ == "__main__":
    main()
