"""What one round trip costs Redis at a low rate (issue 19, the 0.5 s case): Redis's CPU per
round trip, raw and above Redis's own idle, for a PING and for an answer's ledger append as
``gateway.ledger._append`` sends it (RPUSH of an ~880-byte record, the conversation pin's SET
PX, the birth mark's SET NX GET, GET of the config's version: one pipeline), one at a time at
``--rate`` a second, on a redis-server of its own. Redis's idle (its cron, ``hz`` 10) is
measured before each case.

At the 0.5 s case's ~32 requests a second, a request that costs one round trip can cost Redis
no less than this PING's raw figure, whatever the script or commands it sends.

    .venv/bin/python bench/redis_round_trip.py [--rate 32] [--seconds 6] [--reps 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis.asyncio

from tests.stack import RedisServer

RECORD = os.urandom(880)  # compressed records do not compress further


async def cpu_seconds(client: redis.asyncio.Redis) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def ping(client: redis.asyncio.Redis) -> None:
    await client.ping()


async def append(client: redis.asyncio.Redis) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.rpush("bench:ledger", RECORD)
    pipe.set("bench:pin:conversation", b"endpoint-8", px=3_600_000)
    pipe.set("bench:ledger:born", b"0123456789abcdef0123456789abcdef", nx=True, get=True)
    pipe.get("bench:config:version")
    await pipe.execute()


CASES = {"PING": ping, "ledger append": append}


async def case(url: str, name: str, rate: float, seconds: float) -> dict[str, float]:
    client, probe = redis.asyncio.from_url(url), redis.asyncio.from_url(url)
    try:
        await client.ping()
        before = await cpu_seconds(probe)
        await asyncio.sleep(seconds)
        idle_per_s = (await cpu_seconds(probe) - before) / seconds
        loop = asyncio.get_running_loop()
        before, started, sent = await cpu_seconds(probe), loop.time(), 0
        while loop.time() - started < seconds:
            await CASES[name](client)
            sent += 1
            await asyncio.sleep(max(0.0, started + sent / rate - loop.time()))
        elapsed = loop.time() - started
        used = await cpu_seconds(probe) - before
        await client.delete("bench:ledger")
        return {
            "round_trips": sent,
            "raw_us": used / sent * 1e6,
            "idle_ms_per_s": idle_per_s * 1e3,
            "above_idle_us": (used - idle_per_s * elapsed) / sent * 1e6,
        }
    finally:
        await client.aclose()
        await probe.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=32.0, help="round trips a second")
    parser.add_argument("--seconds", type=float, default=6.0, help="per case, and for its idle")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    server = RedisServer(Path(tempfile.mkdtemp(prefix="bench-rt-")))
    server.start()
    try:
        print("| case | rep | round trips | Redis CPU µs / round trip | Redis idle ms / s |"
              " above idle µs / round trip |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|")
        for rep in range(1, args.reps + 1):
            for name in CASES:
                row = await case(server.url, name, args.rate, args.seconds)
                print(f"| {name} | {rep} | {row['round_trips']:.0f} | {row['raw_us']:.0f} |"
                      f" {row['idle_ms_per_s']:.2f} | {row['above_idle_us']:.0f} |")  # fmt: skip
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
