"""Batch API benchmark (issue 18 item 4, SPEC E5): a 10,000-line batch on idle capacity beside
an interactive load, and what it costs that load.

One stack (simulator with no failures, gateway, one Celery worker). An open-loop interactive
load (Poisson arrivals, ``--rate`` requests/s, the acme web key: interactive class) runs
``--baseline`` seconds alone, then again while the ``openai`` SDK uploads a ``--lines`` batch,
creates it and polls it to completion and reads its output file. Per phase: the interactive
requests' queue wait (``x-switchyard-queue-wait-ms``: time waiting for capacity in the fair
queue) and latency percentiles; for the batch its duration, lines/s and the simulator's count
of calls served per line. Writes bench/results/batch.md (``--out``) and prints it.

    .venv/bin/python bench/batch.py                      # the acceptance run: 10,000 lines
    .venv/bin/python bench/batch.py --lines 1000 --scale 1 --out /tmp/batch.md

``--scale`` multiplies every provider limit (the gateway's config and the simulator's market):
at 1 the reference limits bind (alpha 600 + gamma 1200 requests/min for acme/chat-small);
above 1 the limits leave room and the worker's own speed bounds the batch.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import yaml  # noqa: E402

from tests.e2e.batch_support import (  # noqa: E402
    MODEL,
    WEB_KEY,
    batch_file,
    batch_submit,
    batch_wait,
    job_id_of,
    market_without_failures,
    output_lines,
    provider_counts,
    sdk,
)
from tests.stack import RedisServer, Stack, database_url  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "batch.md"


def scaled_market(folder: Path, scale: float) -> Path:
    path = market_without_failures(folder)
    market = yaml.safe_load(path.read_text())
    for provider in market["providers"]:
        provider["limits"] = {k: int(v * scale) for k, v in provider["limits"].items()}
    path.write_text(yaml.safe_dump(market, sort_keys=False))
    return path


def scaled_config(scale: float, slots: int | None = None):
    """``slots``: a concurrency bucket of that many on the team both apps belong to
    (acme/search: the interactive web app and the batch's indexer), so the two share one pool
    of slots that the interactive load alone already waits for at times."""

    def edit(config: dict) -> None:
        for provider in config["providers"]:
            for limit in provider.get("limits", []):
                if "capacity" in limit and limit["dimension"] != "spend":
                    limit["capacity"] = int(limit["capacity"] * scale)
        if slots:
            [acme] = [t for t in config["tenants"] if t["name"] == "acme"]
            [search] = [t for t in acme["teams"] if t["name"] == "search"]
            search.setdefault("limits", []).append({"dimension": "concurrency", "capacity": slots})

    return edit


class InteractiveLoad:
    """Open-loop Poisson arrivals on their own event loop (thread); one record a request."""

    def __init__(self, base_url: str, rate: float, seed: int) -> None:
        self.base_url, self.rate = base_url, rate
        self.rng = random.Random(seed)
        self.records: list[tuple[float, int, float, float]] = []  # at, status, wait ms, latency
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> InteractiveLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30, limits=limits) as client:
            pending: set[asyncio.Task[None]] = set()
            next_at = time.monotonic()
            while not self._stop.is_set():
                next_at += self.rng.expovariate(self.rate)
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                task = asyncio.create_task(self._one(client))
                pending.add(task)
                task.add_done_callback(pending.discard)
            if pending:
                await asyncio.wait(pending)

    async def _one(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
        try:
            answer = await client.post(
                "/v1/chat/completions", headers={"Authorization": f"Bearer {WEB_KEY}"}, json=body
            )
            wait = float(answer.headers.get("x-switchyard-queue-wait-ms", "nan"))
            status = answer.status_code
        except httpx.HTTPError:
            wait, status = float("nan"), 0
        self.records.append((started, status, wait, (time.monotonic() - started) * 1000))

    def between(self, start: float, end: float) -> list[tuple[float, int, float, float]]:
        return [r for r in self.records if start <= r[0] < end]


def percentile(values: list[float], q: float) -> float:
    values = sorted(v for v in values if v == v)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def summary(records: list[tuple[float, int, float, float]], seconds: float) -> dict[str, Any]:
    waits = [r[2] for r in records if r[1] == 200]
    latencies = [r[3] for r in records if r[1] == 200]
    return {
        "requests": len(records),
        "rps": len(records) / seconds if seconds else 0.0,
        "statuses": dict(Counter(r[1] for r in records)),
        "waited": sum(1 for w in waits if w > 0),
        "wait_p50": percentile(waits, 0.50),
        "wait_p99": percentile(waits, 0.99),
        "wait_mean": statistics.fmean(waits) if waits else float("nan"),
        "wait_max": max(waits, default=float("nan")),
        "lat_p50": percentile(latencies, 0.50),
        "lat_p99": percentile(latencies, 0.99),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="sy-batch-bench-"))
    redis_server = RedisServer(folder)
    redis_server.start()
    db_url, cluster = database_url()
    stack = Stack(
        database_url=db_url,
        redis_url=redis_server.url,
        market=scaled_market(folder, args.scale),
        config_edit=scaled_config(args.scale, args.slots),
        latency_scale=args.latency_scale,
    )
    try:
        stack.start()
        load = InteractiveLoad(stack.base_url, args.rate, seed=7).start()
        time.sleep(5)  # warm-up: connections, the router's first measurements
        base_start = time.monotonic()
        time.sleep(args.baseline)
        base_end = time.monotonic()
        client = sdk(stack)
        content = batch_file(args.lines, tag="bench")
        batch_start = time.monotonic()
        created = batch_submit(client, content)
        done = batch_wait(client, created.id, timeout=args.timeout)
        batch_end = time.monotonic()
        records = output_lines(client, done.output_file_id)
        read_end = time.monotonic()
        load.stop()
        calls, served, replays = provider_counts(stack)
        keys = [job_id_of(r) for r in records]
        return {
            "args": vars(args),
            "baseline": summary(load.between(base_start, base_end), base_end - base_start),
            "with_batch": summary(load.between(batch_start, batch_end), batch_end - batch_start),
            "batch": {
                "status": done.status,
                "counts": done.request_counts.model_dump(),
                "seconds": batch_end - batch_start,
                "read_seconds": read_end - batch_end,
                "output_lines": len(records),
                "unique_custom_ids": len({r["custom_id"] for r in records}),
                "served_per_line": dict(Counter(served[k] for k in keys)),
                "received_per_line": dict(Counter(calls[r["custom_id"]] for r in records)),
                "replays": replays,
                "file_bytes": len(content),
            },
        }
    finally:
        stack.stop()
        redis_server.kill()
        if cluster is not None:
            cluster.destroy()


def report(result: dict[str, Any]) -> str:
    args, base, busy, batch = (
        result["args"],
        result["baseline"],
        result["with_batch"],
        result["batch"],
    )
    rise = (busy["wait_p99"] - base["wait_p99"]) / base["wait_p99"] if base["wait_p99"] else None
    if rise is not None:
        rise_text = f"{rise:+.1%}"
    elif busy["wait_p99"] == 0:
        rise_text = "+0 % (0 ms in both phases)"
    else:
        rise_text = f"from 0 ms to {busy['wait_p99']} ms"
    rows = [
        ("interactive requests", base["requests"], busy["requests"]),
        ("interactive requests/s", f"{base['rps']:.1f}", f"{busy['rps']:.1f}"),
        ("statuses", base["statuses"], busy["statuses"]),
        ("requests that waited at all", base["waited"], busy["waited"]),
        ("queue wait p50 (ms)", base["wait_p50"], busy["wait_p50"]),
        ("**queue wait p99 (ms)**", base["wait_p99"], busy["wait_p99"]),
        ("queue wait mean (ms)", f"{base['wait_mean']:.2f}", f"{busy['wait_mean']:.2f}"),
        ("queue wait max (ms)", base["wait_max"], busy["wait_max"]),
        ("latency p50 (ms)", f"{base['lat_p50']:.0f}", f"{busy['lat_p50']:.0f}"),
        ("latency p99 (ms)", f"{base['lat_p99']:.0f}", f"{busy['lat_p99']:.0f}"),
    ]
    table = "\n".join(f"| {name} | {a} | {b} |" for name, a, b in rows)
    slots_text = (
        f"; the team acme/search (both apps) holds at most {args['slots']} requests at once"
        if args["slots"]
        else ""
    )
    return f"""# Batch API beside interactive traffic (issue 18 item 4, E5)

`.venv/bin/python bench/batch.py --lines {args["lines"]} --rate {args["rate"]} --baseline \
{args["baseline"]} --scale {args["scale"]} --latency-scale {args["latency_scale"]}\
{f" --slots {args['slots']}" if args["slots"] else ""}` — run
{datetime.now(UTC):%Y-%m-%d %H:%M} UTC on the shared 2-core machine (other sessions' work on
it too). One stack: the provider simulator (reference market, failures off so every call is a
first call; simulated latency x{args["latency_scale"]}), the gateway (1 uvicorn worker), one
Celery worker (prefork, concurrency 1, with beat). Provider limits x{args["scale"]} of the
reference config{slots_text}. The interactive load is open-loop Poisson at {args["rate"]} requests/s
(acme/search/web, class `interactive`, acme/chat-small, max_tokens 16); the batch is
{args["lines"]} lines of the same model (class `batch`, weight 1, through the `openai` SDK:
`files.create`, `batches.create`, polling `batches.retrieve` every 0.5 s, `files.content`).

## The interactive load: {args["baseline"]} s alone, then while the batch runs

| | alone | beside the batch |
|---|---|---|
{table}

Interactive p99 queue wait beside the batch vs alone: **{rise_text}**.

## The batch

| | |
|---|---|
| status | {batch["status"]} |
| request_counts | {batch["counts"]} |
| input file | {batch["file_bytes"]} bytes |
| upload to completed | {batch["seconds"]:.1f} s ({args["lines"] / batch["seconds"]:.1f} lines/s) |
| files.content of the output | {batch["read_seconds"]:.2f} s |
| output lines / distinct custom_ids | {batch["output_lines"]} / {batch["unique_custom_ids"]} |
| calls served per line at the simulator (per Idempotency-Key) | {batch["served_per_line"]} |
| requests received per line at the simulator (per `user`) | {batch["received_per_line"]} |
| answered from a kept Idempotency-Key (replays) | {batch["replays"]} |
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--baseline", type=float, default=60.0)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--latency-scale", type=float, default=0.05)
    parser.add_argument("--slots", type=int, default=None, help="team concurrency bucket")
    parser.add_argument("--timeout", type=float, default=1500.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    text = report(run(args))
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
