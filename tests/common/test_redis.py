"""The gateway's async Redis client packs commands with hiredis (issue 19): the same bytes as
redis-py's own packer, on whatever connection class the URL chose, and what hiredis refuses
still goes out or fails as redis-py would have it."""

import asyncio
import os

import pytest
import redis.asyncio
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError

from common.redis import hiredis_packing

ARGS = [
    ("FCALL", "queue_admit_0123", 3, "sy:e", "sy:i", "sy:s", "1733400000.25", b"", b"\x00\xff"),
    ("SET", "k", 0.1, "PX", 120_000),
    ("SET", "naïve", 1e300),
    ("FUNCTION LOAD", "REPLACE", "#!lua name=x\n"),
    (b"CONFIG GET", "maxmemory"),
]


@pytest.mark.parametrize("args", ARGS)
def test_it_packs_what_redis_py_packs(args):
    packed = hiredis_packing(Connection)().pack_command(*args)
    assert b"".join(packed) == b"".join(Connection().pack_command(*args))


def test_what_hiredis_refuses_goes_to_redis_py():
    conn = hiredis_packing(Connection)()
    assert b"".join(conn.pack_command("SET", "k", memoryview(b"abc"))) == b"".join(
        Connection().pack_command("SET", "k", memoryview(b"abc"))
    )
    with pytest.raises(DataError):
        conn.pack_command("SET", "k", None)


def test_the_url_keeps_its_connection_class():
    for cls in (Connection, SSLConnection, UnixDomainSocketConnection):
        packing = hiredis_packing(cls)
        assert issubclass(packing, cls)
        assert packing is hiredis_packing(cls)  # one class per kind, not one per client


def test_commands_round_trip_through_a_real_redis():
    async def scenario():
        pool = redis.asyncio.ConnectionPool.from_url(os.environ["REDIS_URL"])
        pool.connection_class = hiredis_packing(pool.connection_class)
        client = redis.asyncio.Redis(connection_pool=pool)
        try:
            await client.set("test:packing:k", "naïve", px=10_000)
            pipe = client.pipeline(transaction=False)
            pipe.get("test:packing:k")
            pipe.incrbyfloat("test:packing:f", 0.1)
            got, total = await pipe.execute()
            assert got == "naïve".encode()
            assert float(total) == pytest.approx(0.1)
            assert await client.execute_command("CONFIG GET", "maxmemory")
        finally:
            await client.delete("test:packing:k", "test:packing:f")
            await client.aclose()

    asyncio.run(scenario())
