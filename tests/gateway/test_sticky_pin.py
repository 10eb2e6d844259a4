"""Pinning a conversation to its endpoint (G12) is written after the answer, in the round trip
that appends the answer's ledger row (``ledger_write_later``), not in one of its own: the pin is
in Redis once the answer's commit returns, expires after the provider's cache time, and when
Redis cannot take it the gateway says so once in its fault log, leaves no unretrieved task
exception and does not send it again."""

import asyncio
import logging
import socket

import orjson
import pytest

from common import redis as sy_redis
from common.faultlog import FaultLog
from gateway import ledger
from gateway.ledger import LedgerBuffer
from routing.core.sticky import StickyState
from routing.live import LiveRouter

RECORD = {"kind": "generation", "id": "gen-sticky"}


def test_it_sets_the_pin_in_the_answer_s_ledger_append(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch, settings: object
) -> None:
    monkeypatch.setattr(sy_redis, "_async_client", None)
    settings.LEDGER_BATCH_SECONDS = 30.0  # type: ignore[attr-defined]  # the commit, not the timer
    buffer = LedgerBuffer()
    live = LiveRouter("cost")

    async def main() -> tuple[bytes | None, int, int]:
        client = sy_redis.async_client()
        try:
            buffer.write(*live.sticky_entry("conv-1", StickyState("ep-a", 1.0, 100), ttl=300.0))
            buffer.add(RECORD)
            await buffer.committed()
            key = sy_redis.key("routing", "sticky", "conv-1")
            return (
                await client.get(key),
                await client.pttl(key),
                await client.llen(sy_redis.key("ledger")),
            )
        finally:
            await client.aclose()

    value, ttl_ms, queued = asyncio.run(main())

    assert value is not None
    assert orjson.loads(value) == {"endpoint": "ep-a", "last_used": 1.0, "prefix_tokens": 100}
    assert 290_000 < ttl_ms <= 300_000
    assert queued == 1
    assert buffer.writes == []


def test_a_pin_alone_reaches_redis_within_the_batch_time(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch, settings: object
) -> None:
    monkeypatch.setattr(sy_redis, "_async_client", None)
    settings.LEDGER_BATCH_SECONDS = 0.05  # type: ignore[attr-defined]
    buffer = LedgerBuffer()
    live = LiveRouter("cost")

    async def main() -> bytes | None:
        client = sy_redis.async_client()
        try:
            buffer.write(*live.sticky_entry("conv-2", StickyState("ep-b", 2.0, 7), ttl=60.0))
            for _ in range(100):
                await asyncio.sleep(0.02)
                if value := await client.get(sy_redis.key("routing", "sticky", "conv-2")):
                    return value
            return None
        finally:
            await client.aclose()

    value = asyncio.run(main())

    assert value is not None and orjson.loads(value)["endpoint"] == "ep-b"


@pytest.fixture
def redis_away(settings):
    """The process's Redis is a port nobody listens on (a real refused connection)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    settings.REDIS_POOL_TIMEOUT = 0.5
    sy_redis._async_client = None
    yield
    sy_redis._async_client = None


def test_a_pin_redis_cannot_take_is_a_fault_line_not_an_unretrieved_exception(
    redis_away, caplog, monkeypatch
):
    monkeypatch.setattr(ledger, "faults", FaultLog())  # not quieted by an earlier test's line
    unretrieved: list[dict] = []
    buffer = LedgerBuffer()

    async def pin_and_commit() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: unretrieved.append(context)
        )
        live = LiveRouter("cost")
        buffer.write(*live.sticky_entry("conv-1", StickyState("ep-a", 1.0, 100), ttl=300.0))
        buffer.add(RECORD)
        await buffer.committed()
        await sy_redis.async_client().aclose()

    with caplog.at_level(logging.WARNING, logger="gateway.ledger"):
        asyncio.run(pin_and_commit())

    assert unretrieved == []
    assert "ledger records could not reach Redis" in caplog.text
    assert len(buffer.records) == 1  # the record is kept for the next flush…
    assert buffer.writes == []  # …the pin is not: a hint, not sent again
