# ruff: noqa: E501 - the report's table rows
"""The fault suite's figures (issue 13): runs tests/faults — each fault on a deployment of its
own, in parallel processes — and writes bench/results/faults.md.

    python -m bench.faults [--jobs 3] [--out bench/results/faults.md]

Each test writes its figures (FAULTS_REPORT_DIR) whatever its outcome; the table says which
passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAULTS = {
    "test_postgresql_restart": (
        "postgresql_restart",
        "PostgreSQL restarted (pg_ctl stop -m fast; start)",
    ),
    "test_redis_restart_empty": ("redis_restart_empty", "Redis killed and started empty"),
    "test_redis_stopped_for_10_s": (
        "redis_stopped_10s",
        "Redis stopped 10 s (SHUTDOWN SAVE; start)",
    ),
    "test_gateway_worker_killed_mid_stream": (
        "gateway_worker_killed",
        "a gateway worker SIGKILLed mid-stream",
    ),
    "test_celery_worker_killed_mid_job": (
        "celery_worker_killed",
        "the Celery worker SIGKILLed mid-job, restarted",
    ),
}


def run(test: str, folder: Path) -> tuple[str, str, float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", f"tests/faults/test_faults.py::{test}", "-q", "-rA",
         "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True,
        env={**__import__("os").environ, "FAULTS_REPORT_DIR": str(folder)},
    )  # fmt: skip
    summary = next(
        (line for line in reversed(result.stdout.splitlines()) if " in " in line),
        result.stdout[-300:],
    )
    return test, summary.strip("= "), time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=3, help="faults run side by side")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "faults.md")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="sy-faults-"))
    started = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(lambda test: run(test, folder), FAULTS))
    wall = time.monotonic() - started
    rows = []
    for test, summary, seconds in outcomes:
        name, title = FAULTS[test]
        path = folder / f"{name}.json"
        figures = json.loads(path.read_text()) if path.exists() else None
        rows.append((test, title, summary, seconds, figures))
        print(f"{test}: {summary} ({seconds:.0f} s)")
    args.out.write_text(report(rows, wall, args.jobs))
    print(f"wrote {args.out}")


def report(rows, wall: float, jobs: int) -> str:
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchyard.settings")
    django.setup()
    from tests.faults import harness as h

    today = datetime.now(UTC).strftime("%Y-%m-%d")
    lines = [
        "# Faults (issue 13)",
        "",
        f"Measured {today} with `python -m bench.faults` (the tests in `tests/faults/`, {jobs} at a",
        f"time in parallel processes; {wall:.0f} s wall clock on this 2-core machine).",
        "",
        "Each fault runs on a deployment of its own: a PostgreSQL cluster (initdb/pg_ctl) and a",
        "redis-server started for it, the provider simulator, the gateway under uvicorn with 2",
        "workers, a Celery worker with beat. One provider account, limited at the simulator to what",
        f"the gateway is configured with ({h.CONCURRENCY} concurrent, {h.REQUESTS_PER_MINUTE} requests a minute).",
        f"Reservation lease {h.LEASE_SECONDS:.0f} s, job lease {h.JOB_LEASE_SECONDS:.0f} s, resume pass every 1 s.",
        "",
        f"Load: open loop, {h.RATE:.0f} requests a second for {h.LOAD_SECONDS:.0f} s whatever the answers",
        "(2 streamed, 2 not, 2 deferred with `Prefer: respond-async`, 1 `GET /v1/generation` of a request",
        f"answered {h.LEDGER_DELAY_SECONDS:.0f} s before, in every 7); the fault begins {h.FAULT_AT:.0f} s in.",
        "",
        "| fault | test | requests | failed | recovery s (bound) | over-admission | ledger rows lost | calls ≠ attempts | jobs not finished | buckets not full |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _test, title, summary, _, f in rows:
        if f is None:
            lines.append(f"| {title} | {summary} | – | – | – | – | – | – | – | – |")
            continue
        failed = f"{f['failed']} ({', '.join(f'{k}: {v}' for k, v in f['failed_by_status'].items()) or '–'})"
        lines.append(
            f"| {title} | {summary} | {f['requests']} | {failed} | {f['recovery_s']} ({f['recovery_bound_s']}) "
            f"| {f['over_admitted']} | {f['ledger_rows_lost']} | {f['calls_not_in_ledger']} "
            f"| {f['jobs_unfinished']} of {f['jobs']} | {len(f['buckets_not_full'])} |"
        )
    notes = [(FAULTS[t][1], f["notes"]) for t, _, _, _, f in rows if f and f["notes"]]
    for title, items in notes:
        lines += ["", f"{title}: " + "; ".join(items)]
    lines += ["", HOW, ""]
    return "\n".join(lines)


HOW = """How each figure is produced:

- **failed**: requests not served — a status other than 200 (202 for a deferred one), or an
  answer cut off ("cut off": a stream that ended before `data: [DONE]`, or 0: no HTTP answer).
  A lookup answered 404 is not counted: the record is not stored yet (the ledger is written
  off the hot path; a record never stored counts under ledger rows lost).
- **recovery**: from the fault's end (the restart returned; the kill sent) to the send time of
  the first request served after the last one that was not; 0 when none failed after the end.
  With jobs run again (the Celery kill), the later of that and the re-runs' last finish.
  The bound is the one the test asserts (job lease + 10 s for the Celery worker).
- **over-admission**: the simulator's 429s (it enforces the configured limits, so each is a
  request the gateway sent over them) plus its peak in flight above the concurrency limit.
- **ledger rows lost**: answered requests (x-request-id; a finished job's generation id) with
  no `gateway_generation` row once the ledger queue in Redis has drained.
- **calls ≠ attempts**: requests whose calls at the simulator (`GET /_calls`, by the `user`
  each request names) differ from the attempts the ledger shows (`quotas_reservation` rows,
  reaped expired leases included, refusals excluded).
- **jobs not finished**: accepted jobs not `succeeded` (within job lease + 40 s of the load).
- **buckets not full**: concurrency buckets below capacity in Redis after the lease ran out.

"Requests failed" during a Redis outage are refusals in the envelope (503 broker_unavailable,
`Retry-After`) and streams the outage cut off: the broker refuses rather than guess. A fault
test fails on any over-admission, lost ledger row, unfinished job, call the ledger does not
show, bucket left below full, or recovery past its bound."""


if __name__ == "__main__":
    main()
