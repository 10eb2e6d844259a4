"""What one proxied request costs Redis (issue 19): µs of Redis time, commands, scripts, bytes.

Starts a redis-server of its own (so ``INFO commandstats`` counts the gateway and nothing
else), a PostgreSQL (``DATABASE_URL`` if it answers, else a throwaway cluster), the provider
simulator and the gateway under uvicorn, as ``bench/gateway_bench.py`` does (the reference
config's limits a million times larger: every request reserves and settles in all of its
buckets, none is refused). For each case it resets the counters (``CONFIG RESETSTAT``), sends
exactly N requests over C connections (an aiohttp client: every request completes, none is
cut off at the end as a timed run would), waits for the gateway to settle, and reads:

- Redis µs per request: the sum of ``usec`` over ``INFO commandstats`` / requests (commands
  run inside scripts count inside their script call's time, FCALL or EVALSHA, so only
  top-level commands are summed);
- Redis CPU per request: ``used_cpu_user + used_cpu_sys`` of the server / requests (includes
  its event loop and idle ticks: an upper bound);
- commands per request: ``calls`` of every command, those inside scripts included (Redis 7
  counts ``redis.call`` under the command's own name), and script calls (FCALL, EVALSHA)
  per request;
- bytes per request: ``total_net_input_bytes`` / requests (everything the clients sent).

Cases: non-streaming and streaming, at simulator latency 0 and with chat-small answering in
about 0.5 s (ttft 0.39 s + 16 tokens at ~140 tokens/s).

    .venv/bin/python bench/redis_cost.py [--requests 2000] [--slow-requests 600] [--label after]

Writes (or updates the section ``--label`` of) bench/results/redis.md and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import redis  # noqa: E402
import yaml  # noqa: E402

from bench.gateway_bench import KEY, MESSAGES, roomy_limits, unlimited_market  # noqa: E402
from bench.redis_counters import Stretch, sent_shares  # noqa: E402
from tests.stack import RedisServer, Stack, database_url  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "redis.md"
SLOW_TTFT_MS = {"median": 390, "p95": 420}
SLOW_TOKENS_PER_S = {"median": 140, "p05": 120}


def slow_market() -> Path:
    """The unlimited market with chat-small answering in about half a second."""
    path = unlimited_market()
    market = yaml.safe_load(path.read_text())
    for provider in market["providers"]:
        model = provider["models"].get("chat-small")
        if model is not None:
            model.update(ttft_ms=dict(SLOW_TTFT_MS), tokens_per_s=dict(SLOW_TOKENS_PER_S))
    path.write_text(yaml.safe_dump(market, sort_keys=False))
    return path


async def drive(url: str, body: dict, requests: int, connections: int) -> tuple[int, float]:
    """Send exactly ``requests`` POSTs, ``connections`` at a time; (non-200 answers, seconds)."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    data = json.dumps(body).encode()
    left = requests
    errors = 0

    async def one_connection(session: aiohttp.ClientSession) -> None:
        nonlocal left, errors
        while left > 0:
            left -= 1
            async with session.post(url, data=data, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    errors += 1

    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.monotonic()
        await asyncio.gather(*(one_connection(session) for _ in range(connections)))
        return errors, time.monotonic() - started


def measure(stack: Stack, client: redis.Redis, *, stream: bool, requests: int, connections: int):
    body: dict = {"model": "acme/chat-small", "messages": MESSAGES, "max_tokens": 16}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    url = f"{stack.base_url}/v1/chat/completions"
    asyncio.run(drive(url, body, 32, connections))  # warm: connections, scripts, snapshot
    time.sleep(0.5)
    port = client.connection_pool.connection_kwargs["port"]
    sent = sent_shares(
        port, stack.workdir / "monitor.txt", lambda: asyncio.run(drive(url, body, 8, 1))
    )
    time.sleep(0.5)
    stretch = Stretch(client)
    errors, seconds = asyncio.run(drive(url, body, requests, connections))
    time.sleep(1.0)  # the ledger's flush and any settle still on its way
    counted = stretch.end()
    evalsha = counted.evalsha
    return {
        "stream": stream,
        "requests": requests,
        "errors": errors,
        "seconds": seconds,
        "usec": counted.client_usec(sent) / requests,
        "cpu_us": counted.cpu_seconds * 1e6 / requests,
        "commands": counted.calls / requests,
        # what clients sent (not what scripts ran): round trips plus the commands pipelined
        "sent_commands": counted.client_calls(sent) / requests,
        "evalsha": evalsha["calls"] / requests,
        "evalsha_usec": evalsha["usec_per_call"],
        "script_usec": evalsha["usec"] / requests,
        "bytes_in": counted.bytes_in / requests,
        "bytes_out": counted.bytes_out / requests,
        "breakdown": {
            name: (s["calls"] / requests, s["usec"] / requests)
            for name, s in sorted(counted.commands.items(), key=lambda kv: -kv[1]["calls"])
        },
    }


def idle(client: redis.Redis, seconds: float) -> dict:
    """What the gateway costs Redis per second with no request in flight, just after traffic
    (heartbeats, polling, the ledger's watch for a lost Redis)."""
    stretch = Stretch(client)
    time.sleep(seconds)
    counted = stretch.end()
    return {
        "commands": counted.calls / seconds,
        "evalsha": counted.evalsha["calls"] / seconds,
        "cpu_us": counted.cpu_seconds * 1e6 / seconds,
        "bytes_in": counted.bytes_in / seconds,
        "breakdown": {name: s["calls"] / seconds for name, s in counted.commands.items()},
    }


def run(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    folder = Path(tempfile.mkdtemp(prefix="sy-redis-cost-"))
    server = RedisServer(folder)
    server.start()
    db_url, cluster = database_url()
    rows: list[dict] = []
    idles: list[dict] = []
    try:
        client = redis.Redis.from_url(server.url)
        cases = [("0", unlimited_market(), 0.0, args.requests)]
        cases.append(("0.5 s", slow_market(), 1.0, args.slow_requests))
        for latency, market, scale, requests in cases:
            client.flushall()  # each stack starts on an empty Redis
            stack = Stack(
                database_url=db_url,
                redis_url=server.url,
                market=market,
                latency_scale=scale,
                gateway_workers=args.workers,
                celery=False,
                config_edit=roomy_limits,
                # The Redis is the benchmark's own: the production prefix, not a stack's
                # longer one (it is in every key a request sends).
                extra_env={"REDIS_PREFIX": "sy"},
            ).start()
            try:
                for stream in (False, True):
                    row = measure(
                        stack, client, stream=stream, requests=requests,
                        connections=args.connections,
                    )  # fmt: skip
                    row["latency"] = latency
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "breakdown"}))
                quiet = idle(client, args.idle_seconds)
                quiet["latency"] = latency
                idles.append(quiet)
                print(json.dumps(quiet))
            finally:
                stack.stop()
        client.close()
    finally:
        server.kill()
        if cluster is not None:
            cluster.destroy()
    return rows, idles


def section(rows: list[dict], idles: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"## {args.label}",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit `{_commit()}`, "
        f"`bench/redis_cost.py --requests {args.requests} --slow-requests {args.slow_requests}"
        f" --connections {args.connections} --workers {args.workers}`.",
        "",
        "| upstream | mode | requests | Redis µs / req | Redis CPU µs / req | commands / req"
        " | of them sent / req | script calls / req | µs / script call | script µs / req"
        " | bytes to Redis / req | bytes from Redis / req | non-200 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mode = "streaming" if r["stream"] else "non-streaming"
        lines.append(
            f"| {r['latency']} | {mode} | {r['requests']} | {r['usec']:.0f} | {r['cpu_us']:.0f}"
            f" | {r['commands']:.1f} | {r['sent_commands']:.2f} | {r['evalsha']:.2f}"
            f" | {r['evalsha_usec']:.0f}"
            f" | {r['script_usec']:.0f}"
            f" | {r['bytes_in']:.0f} | {r['bytes_out']:.0f} | {r['errors']} |"
        )
    lines += [
        "",
        f"With no request in flight, in the {args.idle_seconds:g} s after each stack's traffic,"
        " per second:",
        "",
    ]
    for q in idles:
        parts = ", ".join(f"{name} {calls:.1f}" for name, calls in q["breakdown"].items())
        lines.append(
            f"- after upstream {q['latency']}: {q['commands']:.1f} commands/s "
            f"({q['evalsha']:.1f} script calls), {q['bytes_in']:.0f} bytes/s to Redis, "
            f"{q['cpu_us']:.0f} µs/s of Redis CPU; {parts}"
        )
    lines += ["", "Per-command breakdown (calls / request, µs / request; commands run inside "
              "scripts have their own rows, their time is inside their script call's):",
              ""]  # fmt: skip
    for r in rows:
        mode = "streaming" if r["stream"] else "non-streaming"
        parts = ", ".join(
            f"{name} {calls:.2f}" + (f" ({usec:.0f} µs)" if usec >= 1 else "")
            for name, (calls, usec) in r["breakdown"].items()
            if calls >= 0.01
        )
        lines.append(f"- upstream {r['latency']}, {mode}: {parts}")
    return "\n".join(lines) + "\n"


def _commit() -> str:
    git = ["git", "rev-parse", "--short", "HEAD"]
    return subprocess.run(git, cwd=ROOT, capture_output=True, text=True).stdout.strip()


HEADER = """# Redis cost per proxied request (issue 19)

`bench/redis_cost.py`: a redis-server of the benchmark's own (key prefix `sy`, the default), the
gateway (uvicorn) in front of the provider simulator, the reference config's limits a million
times larger (every request
reserves and settles in all of its buckets). Exactly N requests per case over 16 connections;
figures are the counters' deltas (`CONFIG RESETSTAT` before each case) divided by N. "Redis µs"
is the sum of `usec` over `INFO commandstats` for the commands clients sent (a command a script
runs is counted inside its script call; a MONITOR sample of 8 requests says which share of each
command's calls came from outside scripts); "script µs" is the script calls' part of it; "Redis CPU"
is the server process's user + system CPU (adds the event loop, reading and writing sockets:
an upper bound). Commands count those run inside scripts. Targets: Redis
µs ≤ 120 and bytes to Redis ≤ 2 KB per request at both upstream latencies.
"""


def write(text: str, label: str) -> None:
    old = RESULTS.read_text() if RESULTS.exists() else HEADER
    pattern = re.compile(rf"^## {re.escape(label)}\n.*?(?=^## |\Z)", re.S | re.M)
    new = pattern.sub(lambda _: text + "\n", old) if pattern.search(old) else old + "\n" + text
    RESULTS.write_text(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--slow-requests", type=int, default=600)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--label", default="run")
    args = parser.parse_args()
    rows, idles = run(args)
    text = section(rows, idles, args)
    write(text, args.label)
    print(text)


if __name__ == "__main__":
    main()
