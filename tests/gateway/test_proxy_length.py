"""The proxy's whole answers carry their Content-Length, as Django's full stack gives every
answer (CommonMiddleware, which the thread-free proxy handler does without): uvicorn then sends
the body as it is, in the same write as the headers (gateway/server.py), instead of chunked
after a write of its own. A streamed answer stays chunked."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from common import redis as gateway_redis
from gateway.asgi import application
from gateway.snapshot import holder
from quotas import broker as broker_module
from routing import live
from tests.personas import Personas


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test's loop gets its own Redis client, broker, router and snapshot."""
    monkeypatch.setattr(gateway_redis, "_async_client", None)
    monkeypatch.setattr(broker_module, "_broker", None)
    monkeypatch.setattr(live, "_live", None)
    holder.reset()
    yield
    holder.reset()


def exchange(path: str, raw: bytes, headers: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(raw)).encode()), *headers],
    }  # fmt: skip
    sent: list[dict[str, Any]] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def run() -> None:
        try:
            await application(scope, receive, send)
        finally:
            await gateway_redis.async_client().aclose()

    asyncio.run(run())
    return sent


def test_a_whole_answer_says_its_length_and_is_not_chunked(personas: Personas, fresh: None) -> None:
    raw = orjson.dumps(
        {"model": "acme/chat-small", "messages": [{"role": "user", "content": "hi"}]}
    )
    sent = exchange("/v1/chat/completions", raw, [(b"authorization", b"Bearer sk-sy-nobody")])

    start, *bodies = sent
    headers = {name.lower(): value for name, value in start["headers"]}
    body = b"".join(message["body"] for message in bodies)
    assert start["status"] == 401
    assert orjson.loads(body)["error"]["type"]
    assert headers[b"content-length"] == str(len(body)).encode()
    assert b"transfer-encoding" not in headers
