"""Provider batch benchmark (issue 18 item 4, SPEC E5): a ``--lines`` batch sent to a provider's
own batch API (the simulator's, OpenAI wire) through the ``openai`` SDK, and where its time goes.

One stack (simulator with no failures and alpha offering a batch API, gateway, one Celery
worker), the ``openai`` SDK uploading the batch, creating it, polling it every 0.5 s and reading
the output file. Reported: upload to completed, the gateway's own share (deciding and sending;
writing the answers and finalizing: from the batch's and its lines' timestamps), the provider's
turnaround, and the simulator's counts (lines through its batch API, live calls, repeats).
Writes bench/results/provider_batch.md (``--out``) and prints it.

    .venv/bin/python bench/provider_batch.py                 # 10,000 lines
    .venv/bin/python bench/provider_batch.py --lines 1000 --out /tmp/provider_batch.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import yaml  # noqa: E402

from tests.e2e.batch_support import (  # noqa: E402
    MODEL,
    batch_file,
    batch_submit,
    batch_wait,
    market_without_failures,
    output_lines,
    sdk,
)
from tests.stack import RedisServer, Stack, database_url  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "provider_batch.md"
TURNAROUND = "200s"  # the simulator's, times the latency scale (0.05): 10 s


def market(folder: Path) -> Path:
    path = market_without_failures(folder)
    data = yaml.safe_load(path.read_text())
    for provider in data["providers"]:
        if provider["name"] == "alpha":
            provider["batch"] = {"discount": 0.5, "turnaround": TURNAROUND}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def config_edit(config: dict[str, Any]) -> None:
    for model in config["models"]:
        for endpoint in model["endpoints"]:
            if (model["slug"], endpoint["provider"]) == (MODEL, "alpha"):
                endpoint["batch"] = {"discount": 0.5, "turnaround": "1h"}


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="sy-pbatch-bench-"))
    redis_server = RedisServer(folder)
    redis_server.start()
    db_url, cluster = database_url()
    stack = Stack(
        database_url=db_url,
        redis_url=redis_server.url,
        market=market(folder),
        config_edit=config_edit,
        latency_scale=0.05,
        extra_env={"PROVIDER_BATCH_POLL_SECONDS": "1"},
    )
    try:
        stack.start()
        client = sdk(stack)
        content = batch_file(args.lines, tag="bench")
        started = time.monotonic()
        created = batch_submit(client, content)
        done = batch_wait(client, created.id, timeout=args.timeout)
        ended = time.monotonic()
        records = output_lines(client, done.output_file_id)
        read = time.monotonic() - ended
        [(created_at, in_progress, finalizing, completed)] = stack.sql(
            "SELECT created_at, in_progress_at, finalizing_at, completed_at "
            "FROM gateway_batch WHERE id = %s",
            created.id,
        )
        sim = httpx.get(f"{stack.sim_url('alpha')}/_stats", timeout=10).json()
        live = sum(
            n
            for provider in ("alpha", "gamma")
            for caller, n in httpx.get(f"{stack.sim_url(provider)}/_calls", timeout=10)
            .json()["by_caller"]
            .items()
            if caller.startswith("bench")
        )
        log = stack.log("celery")
    finally:
        stack.stop()
        redis_server.stop()
        if cluster is not None:
            cluster.destroy()
    sent_at = _logged_at(log, "sent to")
    return {
        "status": done.status,
        "counts": f"{done.request_counts.completed} completed, {done.request_counts.failed} failed",
        "seconds": ended - started,
        "read_seconds": read,
        "file_bytes": len(content),
        "start_to_sent": (sent_at - created_at).total_seconds() if sent_at else None,
        "in_progress_to_finalizing": (finalizing - in_progress).total_seconds(),
        "finalizing_to_completed": (completed - finalizing).total_seconds(),
        "output_lines": len(records),
        "unique": len({r["custom_id"] for r in records}),
        "sim": sim["batch"],
        "live": live,
    }


def _logged_at(log: str, words: str) -> datetime | None:
    """When the worker logged the line with ``words`` (Celery's ``[YYYY-mm-dd HH:MM:SS,fff:``
    prefix, the machine's clock: UTC)."""
    for line in log.splitlines():
        if words in line:
            try:
                return datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
            except ValueError:
                continue
    return None


def report(args: argparse.Namespace, r: dict[str, Any]) -> str:
    sim = r["sim"]
    sent = f"{r['start_to_sent']:.1f} s" if r["start_to_sent"] is not None else "not logged"
    rows = "\n".join(
        f"| {what} | {value} |"
        for what, value in [
            ("status", r["status"]),
            ("request_counts", r["counts"]),
            ("input file", f"{r['file_bytes']} bytes"),
            ("upload to completed (SDK)", f"{r['seconds']:.1f} s"),
            ("batch created to sent to the provider (decide, build, upload, create)", sent),
            (
                "in_progress to finalizing (the provider's turnaround, polling, writing answers)",
                f"{r['in_progress_to_finalizing']:.1f} s",
            ),
            ("finalizing to completed (the output file)", f"{r['finalizing_to_completed']:.2f} s"),
            ("files.content of the output", f"{r['read_seconds']:.2f} s"),
            ("output lines / distinct custom_ids", f"{r['output_lines']} / {r['unique']}"),
            (
                "simulator: provider batches / lines through its batch API / custom_ids repeated",
                f"{sim['batches']} / {sim['lines']} / {sim['custom_ids_repeated']}",
            ),
            ("live calls for the batch's lines (alpha, gamma)", r["live"]),
        ]
    )
    return f"""# Provider batch benchmark (E5: a batch sent to a provider's own batch API)

Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `bench/provider_batch.py --lines {args.lines}` on
a shared 2-core machine: one gateway, one Celery worker (`--concurrency=1`), the simulator at
latency scale 0.05 with alpha offering a batch API (turnaround {TURNAROUND}, i.e. 10 s of real
time, lines answered spread over it), `acme/chat-small` on alpha declaring `batch: {{discount:
0.5, turnaround: 1h}}`; the driver polls the provider every 1 s; the SDK polls every 0.5 s.

| | |
|---|---|
{rows}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    text = report(args, run(args))
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
