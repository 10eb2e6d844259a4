"""What one round trip costs Redis at a low rate (issue 19, the 0.5 s case): Redis's CPU per
round trip, raw and above Redis's own idle, for a PING and for an answer's ledger append as
``gateway.ledger._append`` sends it (RPUSH of an ~880-byte record, the conversation pin's SET
PX, the birth mark's SET NX GET, GET of the config's version: one pipeline), one at a time at
``--rate`` a second, on a redis-server of its own. Redis's idle (its cron, ``hz`` 10) is
measured before each case (``bench/redis_counters.py``).

At the 0.5 s case's ~32 requests a second, a request that costs one round trip can cost Redis
no less than this PING's raw figure, whatever the script or commands it sends.

    .venv/bin/python bench/redis_round_trip.py [--rate 32] [--seconds 6] [--reps 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench.redis_counters import idle_cpu_rate, round_trip_cpu
from tests.stack import RedisServer

RECORD = os.urandom(880)  # compressed records do not compress further


def ping(pipe: Any) -> None:
    pipe.ping()


def append(pipe: Any) -> None:
    pipe.rpush("bench:ledger", RECORD)
    pipe.set("bench:pin:conversation", b"endpoint-8", px=3_600_000)
    pipe.set("bench:ledger:born", b"0123456789abcdef0123456789abcdef", nx=True, get=True)
    pipe.get("bench:config:version")


CASES = {"PING": ping, "ledger append": append}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=32.0, help="round trips a second")
    parser.add_argument("--seconds", type=float, default=6.0, help="per case, and for its idle")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    server = RedisServer(Path(tempfile.mkdtemp(prefix="bench-rt-")))
    server.start()
    client = redis.Redis(port=server.port)
    try:
        print("| case | rep | Redis CPU µs / round trip | Redis idle ms / s |"
              " above idle µs / round trip |")  # fmt: skip
        print("|---|---:|---:|---:|---:|")
        for rep in range(1, args.reps + 1):
            for name, commands in CASES.items():
                idle = idle_cpu_rate(client, args.seconds)
                raw = round_trip_cpu(client, args.rate, args.seconds, commands)
                client.delete("bench:ledger")
                print(f"| {name} | {rep} | {raw * 1e6:.0f} | {idle * 1e3:.2f} |"
                      f" {(raw - idle / args.rate) * 1e6:.0f} |")  # fmt: skip
    finally:
        client.close()
        server.stop()


if __name__ == "__main__":
    main()
