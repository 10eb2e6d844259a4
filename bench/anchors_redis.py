"""The Redis phase of ``bench/anchors``: what one proxied request costs Switchyard's Redis.

Run by ``bench/anchors`` against a fresh switchyard-2w (the shared harness's ``start.sh`` and
``config-bench.yaml``, its own empty Redis, the mock upstream) after ``run_all.sh``, because
``run_all.sh`` records only the Redis process's CPU (``aux CPU``), not its counters. Per case,
as ``bench/redis_cost.py`` measures (same definitions, so the figures sit beside redis.md's):

- a warm-up of 64 requests, then a MONITOR sample of 8 sequential requests: which share of each
  command's calls is sent by a client rather than run inside a script (a command a script runs
  is counted in ``INFO commandstats`` under its own name *and* inside its EVALSHA's usec);
- ``CONFIG RESETSTAT``, exactly N requests over C connections (every one completes, none is cut
  off as at the end of a timed wrk run), 1 s to settle, then per request:
  Redis µs = ``usec`` summed over client-sent commands; Redis CPU µs = the server's
  ``used_cpu_user + used_cpu_sys`` (includes its event loop: an upper bound); commands = every
  command's ``calls`` (script-inner included); EVALSHA calls; bytes = ``total_net_input_bytes``;
  gateway CPU = CPU seconds of the uvicorn process tree (``procstat.py``) over the same span.

Upstream latency is the mock's TTFT (``POST /__mock/config``), not the provider simulator.

    python bench/anchors_redis.py --procstat PATH --gateway-pid PID --out results.json
    python bench/anchors_redis.py --idle 5    (Redis's CPU a second with no client, before
                                                the gateway starts: for --redis-idle-cpu)

Redis uses CPU with no client at all (its timer, ``hz`` 10 times a second: ~2 ms a second on
this machine), which at the 0.5 s case's ~31 requests a second is ~60 µs a request by itself;
each case also reports its CPU above that idle, over the same span.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import cpu_per_request
from bench.redis_counters import Stretch, idle_cpu_rate, sent_shares

URL = "http://127.0.0.1:18100/v1/chat/completions"
KEY = "sk-sy-bench-demo-key-000001"  # the harness's config-bench.yaml key
MOCKS = ("http://127.0.0.1:18001", "http://127.0.0.1:18002")
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


async def drive(data: bytes, requests: int, connections: int, think: float = 0.0) -> int:
    """Exactly ``requests`` POSTs to the gateway, ``connections`` at a time; non-200 answers."""
    return await cpu_per_request.drive(URL, data, requests, connections, think)


def set_ttft(ms: int) -> None:
    for mock in MOCKS:
        req = urllib.request.Request(
            f"{mock}/__mock/config", data=json.dumps({"ttft_ms": ms}).encode(), method="POST"
        )
        urllib.request.urlopen(req, timeout=5).read()


def cpu_seconds(procstat: str, pid: int) -> float:
    return float(subprocess.check_output([sys.executable, procstat, "cpu", str(pid)]).split()[0])


def measure(
    client: redis.Redis,
    args,
    *,
    case: str,
    ttft_ms: int,
    stream: bool,
    requests: int,
    think: float = 0.0,
):
    data = body(stream)
    set_ttft(ttft_ms)
    asyncio.run(drive(data, 64, args.connections))  # warm: connections, scripts, snapshot
    sent = sent_shares(
        args.redis_port, Path(args.workdir) / "monitor.txt", lambda: asyncio.run(drive(data, 8, 1))
    )
    time.sleep(0.5)
    stretch = Stretch(client)
    gw0, t0 = cpu_seconds(args.procstat, args.gateway_pid), time.monotonic()
    errors = asyncio.run(drive(data, requests, args.connections, think))
    seconds = time.monotonic() - t0
    time.sleep(1.0)  # a settle still on its way
    gw1 = cpu_seconds(args.procstat, args.gateway_pid)
    counted = stretch.end()
    evalsha = counted.evalsha
    return {
        "case": case,
        "upstream_ttft_ms": ttft_ms,
        "think_s": think,
        "stream": stream,
        "requests": requests,
        "connections": args.connections,
        "errors": errors,
        "seconds": round(seconds, 2),
        "redis_usec_per_req": counted.client_usec(sent) / requests,
        "redis_cpu_us_per_req": counted.cpu_seconds * 1e6 / requests,
        "redis_idle_cpu_ms_per_s": args.redis_idle_cpu * 1000,
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
        "breakdown": {
            n: [s["calls"] / requests, s["usec"] / requests]
            for n, s in sorted(counted.commands.items(), key=lambda kv: -kv[1]["calls"])
        },
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
    p.add_argument("--redis-idle-cpu", type=float, default=0.0, help="CPU s/s idle (--idle)")
    p.add_argument("--idle", type=float, help="only measure Redis idle for this long, print it")
    p.add_argument("--out")
    args = p.parse_args()
    client = redis.Redis(port=args.redis_port)
    if args.idle:
        print(f"{idle_cpu_rate(client, args.idle):.6f}")
        return
    if not (args.procstat and args.gateway_pid and args.out):
        p.error("--procstat, --gateway-pid and --out are required (but with --idle)")
    rows = [
        measure(client, args, case="ttft0", ttft_ms=0, stream=False, requests=args.requests),
        measure(client, args, case="ttft0_stream", ttft_ms=0, stream=True, requests=args.requests),
        measure(
            client, args, case="ttft500", ttft_ms=500, stream=False, requests=args.slow_requests
        ),
        # The same rate as ttft500 with an instant upstream: each connection waits the 0.5 s
        # after its answer instead of before it. Per-request CPU grows as the rate falls (fewer
        # requests share each event-loop wake-up, caches are colder), the Python floor's too;
        # this case tells that apart from what a request costs for each second it is in flight.
        measure(
            client,
            args,
            case="ttft0_paced",
            ttft_ms=0,
            stream=False,
            requests=args.slow_requests,
            think=0.5,
        ),
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
