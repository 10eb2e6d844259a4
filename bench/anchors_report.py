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


def mode(r: dict) -> str:
    kind = "streaming" if r["stream"] else "non-streaming"
    return f"{kind}, 0.5 s between requests" if r.get("think_s") else kind


SY, LL, FLOOR, DIRECT = "switchyard-2w", "litellm-2w", "pyfwd", "direct"


def main() -> None:
    run = Path(sys.argv[1])
    rows = list(csv.DictReader((run / "results.csv").open()))
    memory = list(csv.DictReader((run / "memory.csv").open()))
    redis = json.loads((run / "redis.json").read_text()) if (run / "redis.json").exists() else []
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
    r5 = next((r for r in redis if r["case"] == "ttft500"), None)
    rp = next((r for r in redis if r["case"] == "ttft0_paced"), None)
    conns = redis[0].get("connections", 16) if redis else 16  # REDIS_CONNECTIONS

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
            "`bench/anchors_redis.py` per case: 64 warm-up requests; a MONITOR sample of 8 "
            "requests (which share of each command's calls a client sent rather than a script); "
            f"`CONFIG RESETSTAT`; exactly N requests over {conns} connections with the harness's "
            "request "
            "body (aiohttp; every request completes); 1 s to settle; counters / N. Redis µs = "
            "`usec` of client-sent commands (a script's inner commands are inside its FCALL); "
            "Redis CPU = the server's `used_cpu_user + used_cpu_sys` (event loop and socket I/O "
            "included: an upper bound), and above its idle = less what the same Redis used "
            "with no client, measured for 5 s before the gateway started, over as long; "
            "commands = `calls` of every command, script-inner "
            "included; bytes = `total_net_input_bytes`; gateway CPU = uvicorn's process tree "
            'over the same span (the last 1 s idle included). Upstream "500 ms" is the mock with '
            "TTFT 500 ms (`/__mock/config`), not the provider simulator.\n"
        )
        p(
            "| upstream | mode | requests | errors | Redis µs / req | Redis CPU µs / req | above "
            "its idle | commands / req | FCALL / req | µs / FCALL | bytes to Redis / req | bytes "
            "from Redis / req | gateway CPU ms / req |"
        )
        p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in redis:
            p(
                f"| {r['upstream_ttft_ms']} ms | {mode(r)} | "
                f"{r['requests']} | {r['errors']} | {fmt(r['redis_usec_per_req'], 0)} | "
                f"{fmt(r['redis_cpu_us_per_req'], 0)} | {above_idle(r)} | "
                f"{fmt(r['commands_per_req'], 1)} | "
                f"{fmt(r['evalsha_per_req'], 2)} | {fmt(r['usec_per_evalsha'], 0)} | "
                f"{fmt(r['bytes_in_per_req'], 0)} | {fmt(r['bytes_out_per_req'], 0)} | "
                f"{fmt(r['gateway_cpu_ms_per_req'], 2)} |"
            )
        if redis[0].get("redis_idle_cpu_ms_per_s") is not None:
            p(f"\nRedis idle, before the gateway started: "
              f"{fmt(redis[0]['redis_idle_cpu_ms_per_s'], 2)} ms of CPU a second.")  # fmt: skip
        if r0:
            top = sorted(r0["breakdown"].items(), key=lambda kv: -kv[1][0])[:12]
            p("\nUpstream 0, non-streaming, by command (calls and usec per request, script-inner "
              "commands included and also inside FCALL's usec): "
              + ", ".join(f"`{n}` {c:.1f} / {u:.0f} µs" for n, (c, u) in top) + ".")  # fmt: skip

    p("\n## Acceptance (issue 19), this run\n")

    def line(ok: bool | None, text: str) -> None:
        mark = "not measured" if ok is None else ("**met**" if ok else "**not met**")
        p(f"- {mark}: {text}")

    if r0 and r5:
        worst_us = max(r["redis_cpu_us_per_req"] for r in (r0, r5))
        worst_b = max(r["bytes_in_per_req"] for r in (r0, r5))
        line(
            worst_us <= 120,
            f"Redis CPU per proxied request ≤ 120 µs at upstream 0 and 0.5 s — Redis CPU "
            f"{fmt(r0['redis_cpu_us_per_req'], 0)} / {fmt(r5['redis_cpu_us_per_req'], 0)} µs, "
            f"above Redis's own idle {above_idle(r0)} / {above_idle(r5)} µs, "
            f"Redis time (commandstats) {fmt(r0['redis_usec_per_req'], 0)} / "
            f"{fmt(r5['redis_usec_per_req'], 0)} µs (0 / 500 ms TTFT, mock, not the simulator).",
        )
        line(
            worst_b <= 2048,
            f"bytes sent to Redis ≤ 2 KB per request at 0 and 0.5 s — {fmt(r0['bytes_in_per_req'], 0)}"
            f" / {fmt(r5['bytes_in_per_req'], 0)} bytes (2 KB read as 2,048).",
        )
        g0, g5 = r0["gateway_cpu_ms_per_req"], r5["gateway_cpu_ms_per_req"]
        closed = (
            f"closed loop at {conns} connections {fmt(g0)} → {fmt(g5)} ms ({(g5 / g0 - 1) * 100:+.0f} "
            f"%), where the 0.5 s case also runs at {fmt(r5['requests'] / r5['seconds'], 0)} "
            f"rather than {fmt(r0['requests'] / r0['seconds'], 0)} requests/s"
        )
        if rp:
            gp = rp["gateway_cpu_ms_per_req"]
            line(
                g5 <= 1.2 * gp,
                f"gateway CPU per request at 0.5 s no more than 20 % above 0 — at the same rate "
                f"({fmt(rp['requests'] / rp['seconds'], 0)} requests/s, upstream 0 with 0.5 s "
                f"between a connection's requests) {fmt(gp)} → {fmt(g5)} ms "
                f"({(g5 / gp - 1) * 100:+.0f} %); {closed}.",
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
