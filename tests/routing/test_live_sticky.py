"""Pinning a conversation to its endpoint (G12) is written after the answer, off the request
path: when Redis cannot take it, the gateway says so once in its fault log and nothing is left
as an unretrieved task exception (which asyncio would print, traceback and all, per request)."""

import asyncio
import logging
import socket

import pytest

from common import redis as sy_redis
from routing.core.sticky import StickyState
from routing.live import LiveRouter


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


def test_a_pin_redis_cannot_take_is_a_fault_line_not_an_unretrieved_exception(redis_away, caplog):
    unretrieved: list[dict] = []

    async def pin_and_wait() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: unretrieved.append(context)
        )
        live = LiveRouter("cost")
        live.sticky_set_later("conv-1", StickyState("ep-a", 1.0, 100), ttl=300.0)
        while live._background:
            await asyncio.sleep(0.01)
        await sy_redis.async_client().aclose()

    with caplog.at_level(logging.WARNING, logger="routing.live"):
        asyncio.run(pin_and_wait())

    assert unretrieved == []
    assert "a conversation's endpoint was not pinned" in caplog.text
