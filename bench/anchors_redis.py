"""The Redis phase of ``bench/anchors``: what one proxied request costs Switchyard's Redis.

Run by ``bench/anchors`` against a fresh switchyard-2w (the shared harness's ``start.sh`` and
``config-bench.yaml``, its own empty Redis, the mock upstream) after ``run_all.sh``, because
``run_all.sh`` records only the Redis process's CPU (``aux CPU``), not its counters. Per case,
as ``bench/redis_cost.py`` measures (same definitions, so the figures sit beside redis.md's):

- first, per kind of case, a MONITOR sample of 8 sequential requests: which share of each
  command's calls is sent by a client rather than run inside a script (a command a script runs
  is counted in ``INFO commandstats`` under its own name *and* inside its FCALL's usec);
- per case, a warm-up of 64 requests on the case's connections, ``CONFIG RESETSTAT``, exactly
  N requests over C connections (every one completes, none is cut off as at the end of a timed
  wrk run), 1 s to settle, then per request: Redis µs = ``usec`` summed over client-sent
  commands; Redis CPU µs = the server's ``used_cpu_user + used_cpu_sys`` (includes its event
  loop: an upper bound); commands = every command's ``calls`` (script-inner included); FCALL
  calls; bytes = ``total_net_input_bytes``; gateway CPU = CPU seconds of the uvicorn process
  tree (``procstat.py``) over the same span, and each worker's share of it.

Cases: ``ttft0`` and ``ttft0_stream`` (upstream 0, 16 connections); ``--pairs`` pairs of
``ttft500`` (upstream 0.5 s) and ``ttft0_paced`` (upstream 0, the same rate), each pair over one
set of connections (``pairs``); ``ttft500_c64`` (upstream 0.5 s, 64 connections).

Upstream latency is the mock's TTFT (``POST /__mock/config``), not the provider simulator.

    python bench/anchors_redis.py --procstat PATH --gateway-pid PID --out results.json
    python bench/anchors_redis.py --idle 5    (Redis's CPU a second with no client, before
                                                the gateway starts: for --redis-idle-cpu)
    python bench/anchors_redis.py --lone-append 8   (a lone round trip of the ledger append's
                                                shape at the 0.5 s rate: --lone-append-cpu)
    python bench/anchors_redis.py --procstat PATH --floor-pid PID --out floor.json
                                               (ttft0 and the paced case against the Python
                                                floor, after the gateway's cases)

Redis uses CPU with no client at all (its timer, ``hz`` 10 times a second: ~2 ms a second on
this machine), which at the 0.5 s case's ~31 requests a second is ~60 µs a request by itself;
each case also reports its CPU above that idle, over the same span.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import cpu_per_request
from bench.redis_counters import Stretch, idle_cpu_rate, lone_append_cpu, sent_shares

URL = "http://127.0.0.1:18100/v1/chat/completions"
KEY = "sk-sy-bench-demo-key-000001"  # the harness's config-bench.yaml key
MOCKS = ("http://127.0.0.1:18001", "http://127.0.0.1:18002")
FLOOR_URL = "http://127.0.0.1:18090/v1/chat/completions"  # py_forwarder.py, as run_all.sh runs it
# the body of the harness's wrk/chat.lua, byte for byte the same request as the timed cases
MESSAGES = [
    {"role": "system", "content": "You are a concise assistant used for gateway benchmarking."},
    {
        "role": "user",
        "content": "Say hello and tell me one short fact about latency in distributed systems.",
    },
]


def body(stream: bool) -> bytes:
    b: dict = {"model": "demo-model", "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    if stream:
        b.update(stream=True, stream_options={"include_usage": True})
    return json.dumps(b).encode()


# Exactly N POSTs to the gateway, C connections at a time (cpu_per_request.drive's arguments
# after the URL); returns the count of non-200 answers.
drive = functools.partial(cpu_per_request.drive, URL)


def set_ttft(ms: int) -> None:
    for mock in MOCKS:
        req = urllib.request.Request(
            f"{mock}/__mock/config", data=json.dumps({"ttft_ms": ms}).encode(), method="POST"
        )
        urllib.request.urlopen(req, timeout=5).read()


def cpu_seconds(procstat: str, pid: int) -> float:
    return float(subprocess.check_output([sys.executable, procstat, "cpu", str(pid)]).split()[0])


@dataclass(frozen=True)
class Case:
    name: str
    ttft_ms: int
    stream: bool = False
    think: float = 0.0  # seconds each connection waits after each answer
    stagger: float = 0.0  # the connections' first requests spread over this many seconds


FAST = Case("ttft0", 0)
FAST_STREAM = Case("ttft0_stream", 0, stream=True)
SLOW = Case("ttft500", 500, stagger=0.5)
# The same rate as ttft500 with an instant upstream: each connection waits the 0.5 s after its
# answer instead of before it. Per-request CPU grows as the rate falls (fewer requests share
# each event-loop wake-up, caches are colder), the Python floor's too; this case tells that
# apart from what a request costs for each second it is in flight.
PACED = Case("ttft0_paced", 0, think=0.5, stagger=0.5)
SLOW_C64 = Case("ttft500_c64", 500)


def shares(args, case: Case) -> dict[str, float]:
    """Which share of each command's calls a client sent, from a MONITOR sample of 8
    sequential requests of this case (a connection of their own)."""
    set_ttft(case.ttft_ms)
    data = body(case.stream)
    out = Path(args.workdir) / f"monitor-{case.name}.txt"
    return sent_shares(args.redis_port, out, lambda: asyncio.run(drive(data, 8, 1)))


async def measure(
    client: redis.Redis,
    args,
    over: aiohttp.ClientSession,
    case: Case,
    sent: dict[str, float],
    *,
    requests: int,
    connections: int,
    rep: int = 1,
) -> dict:
    """Exactly ``requests`` of ``case`` over the connections of ``over``, after 64 warm-up
    requests on them, with 1 s after for a settle on its way."""
    data = body(case.stream)
    set_ttft(case.ttft_ms)
    await drive(data, 64, connections, over=over)  # warm: connections, scripts, snapshot
    await asyncio.sleep(0.5)
    stretch = Stretch(client)
    pids = cpu_per_request.workers(args.gateway_pid)
    per0 = [cpu_per_request.cpu(pid) for pid in pids]
    gw0, t0 = cpu_seconds(args.procstat, args.gateway_pid), time.monotonic()
    errors = await drive(data, requests, connections, case.think, over=over, stagger=case.stagger)
    seconds = time.monotonic() - t0
    await asyncio.sleep(1.0)  # a settle still on its way
    gw1 = cpu_seconds(args.procstat, args.gateway_pid)
    per = [cpu_per_request.cpu(pid) - before for pid, before in zip(pids, per0, strict=True)]
    counted = stretch.end()
    evalsha = counted.evalsha
    return {
        "case": case.name,
        "rep": rep,
        "upstream_ttft_ms": case.ttft_ms,
        "think_s": case.think,
        "stream": case.stream,
        "requests": requests,
        "connections": connections,
        "errors": errors,
        "seconds": round(seconds, 2),
        "redis_usec_per_req": counted.client_usec(sent) / requests,
        "redis_cpu_us_per_req": counted.cpu_seconds * 1e6 / requests,
        "redis_idle_cpu_ms_per_s": args.redis_idle_cpu * 1000,
        "lone_append_cpu_us": args.lone_append_cpu * 1e6,  # at the 0.5 s cases' rate
        # less what the same Redis used idle, before any gateway connected, over as long
        "redis_cpu_above_idle_us_per_req": (
            (counted.cpu_seconds - args.redis_idle_cpu * stretch.seconds) * 1e6 / requests
        ),
        "commands_per_req": counted.calls / requests,
        "evalsha_per_req": evalsha["calls"] / requests,
        "usec_per_evalsha": evalsha["usec"] / evalsha["calls"] if evalsha["calls"] else 0.0,
        "bytes_in_per_req": counted.bytes_in / requests,
        "bytes_out_per_req": counted.bytes_out / requests,
        "gateway_cpu_ms_per_req": (gw1 - gw0) * 1000 / requests,
        # each worker's share of the workers' CPU: how uvicorn's accept spread the connections
        "worker_cpu_shares": [round(c / sum(per), 2) if sum(per) else 0.0 for c in per],
        "breakdown": {
            n: [s["calls"] / requests, s["usec"] / requests]
            for n, s in sorted(counted.commands.items(), key=lambda kv: -kv[1]["calls"])
        },
    }


async def alone(client: redis.Redis, args, case: Case, sent, *, requests: int, connections: int):
    """One case over connections of its own."""
    async with cpu_per_request.session(connections) as over:
        return await measure(
            client, args, over, case, sent, requests=requests, connections=connections
        )


async def pairs(client: redis.Redis, args, sent: dict[str, dict[str, float]]) -> list[dict]:
    """ttft500 and ttft0_paced, ``--pairs`` times, each pair over one set of connections, the
    order alternating, both cases' connections starting spread over 0.5 s.

    - One set of connections: uvicorn's accept hands each new connection to one worker,
      unevenly (16 connections: 16/0 one time, 9/7 the next), and a case's CPU per request moves
      with that split by more than the difference asked about (−10 to +33 % between runs of the
      same code, each case on connections of its own).
    - Spread: connections that start together stay together in the paced case (each waits the
      same 0.5 s after an instant answer), so its requests came in bunches that shared the
      workers' wake-ups and the ledger's appends (0.39 RPUSH a request against the 0.5 s case's
      0.71) and made it 25–39 % cheaper; spread, both cases get requests one by one.
    """
    rows = []
    for rep in range(1, args.pairs + 1):
        order = (PACED, SLOW) if rep % 2 else (SLOW, PACED)
        async with cpu_per_request.session(args.connections) as over:
            for case in order:
                rows.append(
                    await measure(
                        client,
                        args,
                        over,
                        case,
                        sent[case.name],
                        requests=args.slow_requests,
                        connections=args.connections,
                        rep=rep,
                    )
                )
    return rows


async def floor(args, case: Case, requests: int) -> dict:
    """``case`` against the Python floor (the harness's ``py_forwarder.py``, one process, in
    front of the same mock) instead of the gateway: what the same load costs a 40-line
    forwarder, the part of a request's CPU that comes from the machine and the load's shape."""
    data, connections = body(case.stream), args.connections
    set_ttft(case.ttft_ms)
    async with cpu_per_request.session(connections) as over:
        await cpu_per_request.drive(FLOOR_URL, data, 64, connections, over=over)
        await asyncio.sleep(0.5)
        cpu0, t0 = cpu_seconds(args.procstat, args.floor_pid), time.monotonic()
        errors = await cpu_per_request.drive(
            FLOOR_URL, data, requests, connections, case.think, over, case.stagger
        )
        seconds = time.monotonic() - t0
        await asyncio.sleep(1.0)
        cpu1 = cpu_seconds(args.procstat, args.floor_pid)
    return {
        "case": case.name,
        "requests": requests,
        "connections": connections,
        "errors": errors,
        "seconds": round(seconds, 2),
        "cpu_ms_per_req": (cpu1 - cpu0) * 1000 / requests,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procstat")
    p.add_argument("--gateway-pid", type=int)
    p.add_argument("--redis-port", type=int, default=16392)
    p.add_argument("--workdir", default="/tmp")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--slow-requests", type=int, default=960)
    p.add_argument("--pairs", type=int, default=3, help="ttft500 / ttft0_paced pairs")
    p.add_argument("--redis-idle-cpu", type=float, default=0.0, help="CPU s/s idle (--idle)")
    p.add_argument("--idle", type=float, help="only measure Redis idle for this long, print it")
    p.add_argument(
        "--lone-append",
        type=float,
        help="only measure a lone ledger-shaped round trip's Redis CPU (lone_append_cpu) for "
        "this long, at the 0.5 s cases' rate (--connections / 0.5 s), print it",
    )
    p.add_argument("--lone-append-cpu", type=float, default=0.0, help="CPU s (--lone-append)")
    p.add_argument(
        "--floor-pid",
        type=int,
        help="only run ttft0 and the paced case against the "
        "Python floor (this PID, on 18090), into --out",
    )
    p.add_argument("--out")
    args = p.parse_args()
    client = redis.Redis(port=args.redis_port)
    if args.idle:
        print(f"{idle_cpu_rate(client, args.idle):.6f}")
        return
    if args.lone_append:
        print(f"{lone_append_cpu(client, args.connections / 0.5, args.lone_append):.7f}")
        return
    if args.floor_pid and args.procstat and args.out:
        fast = asyncio.run(floor(args, FAST, 2 * args.requests))
        rows = [fast, asyncio.run(floor(args, PACED, args.slow_requests))]
        set_ttft(0)
        Path(args.out).write_text(json.dumps(rows, indent=1))
        print(*rows, sep="\n")
        return
    if not (args.procstat and args.gateway_pid and args.out):
        p.error("--procstat, --gateway-pid and --out are required (but with --idle, --lone-append)")
    fast, c16 = args.requests, args.connections
    set_ttft(0)
    asyncio.run(drive(body(False), 64, c16))  # the first requests load scripts and the config
    sent = {case.name: shares(args, case) for case in (FAST, FAST_STREAM, SLOW, PACED)}
    rows = [
        asyncio.run(alone(client, args, FAST, sent[FAST.name], requests=fast, connections=c16)),
        asyncio.run(
            alone(client, args, FAST_STREAM, sent[FAST_STREAM.name], requests=fast, connections=c16)
        ),
        *asyncio.run(pairs(client, args, sent)),
        # the 0.5 s upstream at 4x the rate: Redis's per-second costs (its own timer, each
        # process's heartbeat and allowances) shared by 4x the requests
        asyncio.run(alone(client, args, SLOW_C64, sent[SLOW.name], requests=fast, connections=64)),
    ]
    set_ttft(0)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(
            {
                k: (round(v, 2) if isinstance(v, float) else v)
                for k, v in r.items()
                if k != "breakdown"
            }
        )


if __name__ == "__main__":
    main()
