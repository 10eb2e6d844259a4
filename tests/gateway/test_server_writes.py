"""gateway.server.HttpProtocol on a real socket: an answer whose length is known goes out in
one write, status line and headers with the body (uvicorn alone writes them apart: two system
calls, and on loopback two wake-ups of the client); a streamed answer still sends its headers
before its first chunk, a HEAD answer its headers alone, and every byte is the same."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
import uvicorn

from gateway.server import HttpProtocol

writes: list[bytes] = []


class CountedTransport:
    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CountedProtocol(HttpProtocol):
    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(CountedTransport(transport))


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        await asyncio.sleep(0.3)  # the first chunk comes later: the headers must not wait
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b'{"ok":true}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def exchange(port: int, request: bytes, *, first_within: float) -> tuple[bytes, bytes]:
    """(what arrived within ``first_within`` s, everything until the answer is whole)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    first = b""
    try:
        async with asyncio.timeout(first_within):
            first = await reader.read(65536)
    except TimeoutError:
        pass
    rest = b""
    try:
        async with asyncio.timeout(1.0):
            while chunk := await reader.read(65536):
                rest += chunk
    except TimeoutError:
        pass
    writer.close()
    return first, first + rest


@pytest.mark.timeout(20)
def test_a_sized_answer_is_one_write_a_stream_s_headers_go_at_once_head_is_whole() -> None:
    async def scenario() -> dict[str, Any]:
        port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, http=CountedProtocol, lifespan="off",
            log_level="warning", loop="asyncio",
        )  # fmt: skip
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        seen: dict[str, Any] = {}
        try:
            writes.clear()
            _, seen["sized"] = await exchange(
                port, b"GET /sized HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                first_within=1.0,
            )  # fmt: skip
            seen["sized_writes"] = list(writes)
            writes.clear()
            seen["stream_first"], seen["stream"] = await exchange(
                port, b"GET /stream HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                first_within=0.15,
            )  # fmt: skip
            writes.clear()
            _, seen["head"] = await exchange(
                port, b"HEAD /sized HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                first_within=1.0,
            )  # fmt: skip
        finally:
            server.should_exit = True
            await serving
        return seen

    seen = asyncio.run(scenario())

    assert len(seen["sized_writes"]) == 1
    assert seen["sized"].startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 11\r\n" in seen["sized"]
    assert seen["sized"].endswith(b'\r\n\r\n{"ok":true}')
    # the stream's headers arrived before its first chunk was sent (0.3 s later)
    assert seen["stream_first"].startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"data: 1" not in seen["stream_first"]
    assert b"data: 1" in seen["stream"]
    assert seen["head"].startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 11\r\n" in seen["head"] and seen["head"].endswith(b"\r\n\r\n")
