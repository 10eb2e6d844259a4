# ruff: noqa: E501 - the report's lines
"""How long the broker stays conservative after Redis restarted empty under load (issue 14):
runs the restart test ``tests/e2e/test_redis_restart.py::
test_after_an_empty_restart_the_conservative_period_ends_within_seconds`` a few times and
writes bench/results/recovery.md from the figures it reports (RECOVERY_REPORT).

    python -m bench.recovery [--runs 3] [--out bench/results/recovery.md]

Uses DATABASE_URL when it answers, else a throwaway PostgreSQL cluster (initdb/pg_ctl); each
run starts a redis-server and a stack of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from tests.e2e import test_redis_restart as t
from tests.stack import PostgresCluster

ROOT = Path(__file__).resolve().parent.parent
TEST = (
    "tests/e2e/test_redis_restart.py::"
    "test_after_an_empty_restart_the_conservative_period_ends_within_seconds"
)


def database_answers(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()
        return True
    except psycopg.Error:
        return False


def run_once(folder: Path, index: int, database_url: str) -> tuple[str, dict | None]:
    report = folder / f"run-{index}.json"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", TEST, "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "DATABASE_URL": database_url, "RECOVERY_REPORT": str(report)},
    )
    summary = next(
        (line for line in reversed(result.stdout.splitlines()) if " in " in line),
        result.stdout[-300:],
    ).strip("= ")
    return summary, json.loads(report.read_text()) if report.exists() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "recovery.md")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="sy-recovery-"))
    cluster = None
    database_url = os.environ.get("DATABASE_URL", "")
    if not database_url or not database_answers(database_url):
        cluster = PostgresCluster()
        cluster.init()
        database_url = cluster.url
    started = time.monotonic()
    try:
        runs = []
        for i in range(args.runs):
            summary, figures = run_once(folder, i, database_url)
            print(f"run {i + 1}: {summary} {figures}")
            runs.append((summary, figures))
    finally:
        if cluster is not None:
            cluster.destroy()
    args.out.write_text(report(runs, time.monotonic() - started))
    print(f"wrote {args.out}")


def report(runs: list[tuple[str, dict | None]], wall: float) -> str:
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    periods = [f["conservative_period_s"] for _, f in runs if f and f["conservative_period_s"]]
    lines = [
        "# Recovery of the broker's state after Redis restarted empty (issue 14)",
        "",
        f"Measured {today} with `python -m bench.recovery` ({len(runs)} runs, {wall:.0f} s wall clock",
        "on this 2-core machine, other work sharing it).",
        "",
        "Each run is the restart test `tests/e2e/test_redis_restart.py::"
        "test_after_an_empty_restart_the_conservative_period_ends_within_seconds`: a redis-server",
        "of its own, the provider simulator with one provider limited to",
        f"{t.CONCURRENCY} concurrent requests (the gateway configured with the same limit), the gateway",
        "under uvicorn with 2 worker processes, reservation lease 30 s (the default; streams renew",
        "every 10 s, so no stream of the test renews — only the processes' reports can re-register",
        "them). 10 clients stream answers of 80 tokens (about 2 s) back to back; 3 s in, Redis is",
        "SIGKILLed and started again empty (no data, no scripts, no epoch).",
        "",
        "| run | test | conservative period s | requests | served | not served, by status | refused `recovering` (Retry-After s) | provider peak in flight / limit | provider 429s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (summary, f) in enumerate(runs, 1):
        if f is None:
            lines.append(f"| {i} | {summary} | – | – | – | – | – | – | – |")
            continue
        period = f["conservative_period_s"]
        shown = "never ended" if period is None else f"{period:.2f}"
        retry = ", ".join(str(s) for s in f["retry_after_s"]) or "–"
        others = ", ".join(f"{k}: {v}" for k, v in f.get("not_served", {}).items()) or "–"
        lines.append(
            f"| {i} | {summary} | {shown} | {f['requests']} | {f['served']} | {others} "
            f"| {f['refused_recovering']} ({retry}) | {f['peak_concurrency']} / {f['capacity']} "
            f"| {f['provider_429']} |"
        )
    if periods:
        lines += [
            "",
            f"Conservative period: {min(periods):.2f}–{max(periods):.2f} s (bound asserted by the test:",
            f"{t.RECOVERY_BOUND_SECONDS:.0f} s; before issue 14 it was one lease, 30 s).",
        ]
    lines += ["", HOW, ""]
    return "\n".join(lines)


HOW = """How each figure is produced:

- **conservative period**: from the moment the restarted Redis answers to the first time the
  test reads its epoch (`<prefix>:epoch`, every 20 ms) with `until` at or before Redis's clock:
  the learning period over. In between, the gateway processes noticed the loss (heartbeat every
  1 s, sooner on a refusal), re-registered the streams they still held and reported in the
  epoch; the last to report ended the period (`quotas/recovery.py`, `quotas/core/recovery.py`).
- **not served**: 503 `broker_unavailable` while Redis was down, 429 refusals (queue deadline,
  `recovering`), 0 for a client-side error.
- **refused `recovering`**: 429s whose error `reason` is `recovering`, with the `Retry-After`
  values they carried (the expected end of the recovery, at least 1 s).
- **provider peak in flight / limit**, **provider 429s**: the simulator's own count of
  concurrent requests and of requests it refused over its limit: admissions never exceeded the
  capacity, streams from before the restart included."""


if __name__ == "__main__":
    main()
