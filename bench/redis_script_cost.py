"""The broker's two scripts for one proxied request, alone (issue 19): the reference config's
eight buckets of one request (app and provider concurrency, a tenant's 5-hour spend window and
daily tokens, the provider's per-minute input, output and request refills and daily requests),
admitted through the fair queue's fast path and reconciled, back to back, on a redis-server of
its own. Prints Redis µs per request and per script call (FCALL, or EVALSHA before the
function library), commands (those run inside the scripts included) and bytes sent per
request: the gateway's figures (bench/redis_cost.py) without the HTTP stack, so a change to
the Lua can be measured in seconds.

    .venv/bin/python bench/redis_script_cost.py [--requests 2000] [--buckets 0,3] [--ledger]
        [--concurrency 1]

--concurrency N: N requests in flight at once (each admits, then settles), so the process's
calls meet and go in batches (quotas/store/library.py), as the gateway's do under load.

--ledger: each settle carries the answer's ledger records as the gateway's does
(quotas/store/base.py LedgerCarry: a ~530-byte reservation record the script completes with
its settlement, a ~430-byte generation record, the birth mark).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import redis.asyncio

from quotas.core.model import BucketSpec, Dimension, Grant, Rule, Usage, Window
from quotas.queue import BrokerQueue
from quotas.store.base import LedgerCarry
from quotas.store.queue_redis import RedisQueueStore
from quotas.store.redis import RedisReservationStore
from tests.stack import RedisServer

POOL = "provider:1"
BUCKETS = [
    BucketSpec("app:acme/search/web:concurrency", "app:1", Dimension.CONCURRENCY,
               Rule.CONCURRENCY, 1e9),
    BucketSpec("tenant:acme:spend:rolling-5h", "tenant:1", Dimension.SPEND,
               Rule.ROLLING_WINDOW, 5e7, 18000),
    BucketSpec("tenant:acme:total_tokens:day", "tenant:1", Dimension.TOTAL_TOKENS,
               Rule.FIXED_WINDOW, 5e12, window=Window.DAY),
    BucketSpec("provider:alpha:concurrency", POOL, Dimension.CONCURRENCY, Rule.CONCURRENCY, 1e9),
    BucketSpec("provider:alpha:input_tokens:1m", POOL, Dimension.INPUT_TOKENS, Rule.REFILL,
               4e11, 60),
    BucketSpec("provider:alpha:output_tokens:1m", POOL, Dimension.OUTPUT_TOKENS, Rule.REFILL,
               8e10, 60),
    BucketSpec("provider:alpha:requests:1m", POOL, Dimension.REQUESTS, Rule.REFILL, 1e10, 60),
    BucketSpec("provider:alpha:requests:day", POOL, Dimension.REQUESTS, Rule.FIXED_WINDOW,
               1e12, window=Window.DAY),
]  # fmt: skip
DEMAND = Usage(requests=1, input_tokens=16, output_tokens=16, spend=6.4e-6, concurrency=1)
ACTUAL = Usage(requests=1, input_tokens=18, output_tokens=16, spend=6.6e-6, concurrency=1)


def cpu_seconds(admin: redis.Redis) -> float:
    cpu = admin.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


@contextlib.asynccontextmanager
async def private_broker(
    name: str,
) -> AsyncIterator[tuple[str, RedisReservationStore, BrokerQueue]]:
    """A redis-server of its own (killed after), the store bootstrapped in it and its fair
    queue: (the server's URL, store, queue)."""
    server = RedisServer(Path(tempfile.mkdtemp(prefix=f"sy-{name}-")))
    server.start()
    try:
        client = redis.asyncio.Redis.from_url(server.url)
        store = RedisReservationStore(client, prefix="sy")
        await store.bootstrap()
        try:
            yield server.url, store, BrokerQueue(RedisQueueStore(store))
        finally:
            await client.aclose()
    finally:
        server.kill()


def ledger_carry() -> LedgerCarry:
    """Ledger records of the gateway's sizes (deflated JSON is incompressible noise here)."""
    mark = uuid.uuid4().hex.encode()
    return LedgerCarry(
        "sy:ledger",
        "sy:ledger:born",
        mark,
        b"\x02" + random.randbytes(530),
        [b"\x02" + random.randbytes(430)],
    )


async def admit_and_settle(
    queue: BrokerQueue,
    store: RedisReservationStore,
    buckets: list[BucketSpec],
    ledger: bool = False,
) -> None:
    """One proxied request's two script calls: the fair queue's fast path, then the settle
    (carrying the answer's ledger records with ``ledger``)."""
    grant = await queue.admit(
        uuid.uuid4().hex, buckets, DEMAND, pool=POOL, flow="1/interactive",
        weight=8.0, deadline=store.local_now() + 10, max_depth=0, flow_depth=0,
    )  # fmt: skip
    assert isinstance(grant, Grant), grant
    await queue.reconcile(grant, ACTUAL, carry=ledger_carry() if ledger else None)


async def run(
    requests: int, buckets: list[BucketSpec], ledger: bool, concurrency: int = 1
) -> dict[str, float]:
    async with private_broker("script-cost") as (url, store, queue):
        for _ in range(50):
            await admit_and_settle(queue, store, buckets, ledger)
        admin = redis.Redis.from_url(url)
        admin.config_resetstat()
        cpu_before = cpu_seconds(admin)

        async def one_after_another(n: int) -> None:
            for _ in range(n):
                await admit_and_settle(queue, store, buckets, ledger)

        share, more = divmod(requests, concurrency)
        await asyncio.gather(*(one_after_another(share + (i < more)) for i in range(concurrency)))
        cpu = cpu_seconds(admin) - cpu_before
        stats = {k.removeprefix("cmdstat_"): v for k, v in admin.info("commandstats").items()}
        sent = admin.info("stats")["total_net_input_bytes"]
        stats.pop("config|resetstat", None)
        stats.pop("info", None)
        # the script calls: FCALL (the function library), EVALSHA before it
        calls = sum(stats.get(n, {}).get("calls", 0) for n in ("evalsha", "eval", "fcall"))
        usec = sum(stats.get(n, {}).get("usec", 0) for n in ("evalsha", "eval", "fcall"))
        admin.close()
        return {
            "µs / request": usec / requests,
            # the server's CPU: unlike commandstats' usec, not counting time it waited for a
            # core (the machine is shared), but adding its event loop and sockets
            "Redis CPU µs / request": cpu * 1e6 / requests,
            "µs / script call": usec / calls,
            "script calls / request": calls / requests,
            "commands / request": sum(s["calls"] for s in stats.values()) / requests,
            "bytes / request": sent / requests,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--buckets", default="", help="indexes into BUCKETS (default: all)")
    parser.add_argument("--ledger", action="store_true", help="settles carry ledger records")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight")
    args = parser.parse_args()
    chosen = [BUCKETS[int(i)] for i in args.buckets.split(",")] if args.buckets else BUCKETS
    result = run(args.requests, chosen, args.ledger, args.concurrency)
    for name, value in asyncio.run(result).items():
        print(f"{name}: {value:.1f}")


if __name__ == "__main__":
    main()
