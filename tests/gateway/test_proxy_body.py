"""The proxy handler reads a request's body from the ASGI messages uvicorn sends (gateway/asgi.py):
one message (the usual case) is read from memory as it came, several go to a spooled file."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.core.exceptions import RequestAborted

from gateway.asgi import proxy_handler


def receiving(*messages: dict[str, Any]) -> Any:
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    return receive


def read(*messages: dict[str, Any]) -> bytes:
    async def go() -> bytes:
        body_file = await proxy_handler.read_body(receiving(*messages))
        try:
            return body_file.read()
        finally:
            body_file.close()

    return asyncio.run(go())


def test_it_reads_a_body_that_came_in_one_message():
    assert read({"type": "http.request", "body": b'{"a": 1}'}) == b'{"a": 1}'
    assert read({"type": "http.request"}) == b""


def test_it_reads_a_body_that_came_in_several_messages_in_their_order():
    parts = [b"x" * 70_000, b"y" * 5, b"", b"z" * 3_000_000]  # the last past the memory limit
    messages = [{"type": "http.request", "body": p, "more_body": True} for p in parts]
    messages.append({"type": "http.request", "body": b"end", "more_body": False})
    assert read(*messages) == b"".join(parts) + b"end"


def test_it_stops_reading_when_the_client_leaves_mid_body():
    with pytest.raises(RequestAborted):
        read({"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"})
    with pytest.raises(RequestAborted):
        read({"type": "http.disconnect"})
