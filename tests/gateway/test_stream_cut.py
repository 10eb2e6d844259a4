"""A stream the client cuts off while a chunk is being sent is settled at once (SPEC C8–C10,
E3): by the time the proxy handler returns, the lease is gone, the ledger has the request's one
row (499, cancelled) and the Idempotency-Key is free for a retry — not when the garbage
collector finds the abandoned stream.

The ASGI server here is a script: it sends the request, then lets the first body chunk's
``send`` wait, as a server does for a client that stops reading, until the client hangs up;
the hang-up (``http.disconnect``) makes the handler give up on that ``send``. Through uvicorn
on loopback this moment cannot be forced (the kernel buffers megabytes of a stream), so the
real handler, broker, Redis and ledger run in-process; the provider streams from a loopback
port (``tests.loopback_provider``), one event per write.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from asgiref.sync import async_to_sync

from common import redis as gateway_redis
from gateway import ledger, upstream
from gateway.asgi import application
from gateway.snapshot import holder
from quotas import broker as broker_module
from quotas.core.keys import lease_index_key
from routing import live
from tests.loopback_provider import LoopbackProvider, providers_served_by
from tests.personas import ACME_KEY, Personas

PROVIDER_URLS = ("http://127.0.0.1:9101/v1", "http://127.0.0.1:9102", "http://127.0.0.1:9103/v1")
BODY = {
    "model": "acme/chat-small",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
}
WORDS = ["once", " upon", " a", " time"]


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    event = {
        "id": "up-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "chat-small",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    return b"data: " + orjson.dumps(event) + b"\n\n"


def provider_stream() -> Iterator[bytes]:
    """Paced, so each event is a read of its own: the stream is still running when the client
    stops reading its first chunk (loopback would hand the gateway all six in one read)."""
    yield chunk({"role": "assistant", "content": ""})
    for word in WORDS:
        time.sleep(0.02)
        yield chunk({"content": word})
    time.sleep(0.02)
    yield chunk({}, "stop")
    yield b"data: [DONE]\n\n"


@pytest.fixture
def providers(personas: Personas) -> Iterator[None]:
    def answer(body: bytes) -> httpx.Response:
        return httpx.Response(
            200, content=provider_stream(), headers={"content-type": "text/event-stream"}
        )

    with LoopbackProvider(answer) as served:
        providers_served_by(served, PROVIDER_URLS)
        yield


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test's loop gets its own Redis client, broker, router and snapshot."""
    monkeypatch.setattr(gateway_redis, "_async_client", None)
    monkeypatch.setattr(broker_module, "_broker", None)
    monkeypatch.setattr(live, "_live", None)
    holder.reset()
    yield
    holder.reset()


def scope(raw: bytes, idempotency_key: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {ACME_KEY}".encode()),
            (b"idempotency-key", idempotency_key.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


class Client:
    """An ASGI server's side of one exchange: the request, then what the handler sends. One
    that ``stops_reading`` never completes the ``send`` of the first body chunk, and hangs up
    while it waits."""

    def __init__(self, raw: bytes, *, stops_reading: bool) -> None:
        self.raw = raw
        self.stops_reading = stops_reading
        self.requested = False
        self.gone = asyncio.Event()
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if not self.requested:
            self.requested = True
            return {"type": "http.request", "body": self.raw, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if self.stops_reading and message["type"] == "http.response.body" and message["body"]:
            self.gone.set()
            await asyncio.Event().wait()  # the socket never drains


def test_a_stream_cut_off_mid_send_is_settled_before_the_handler_returns(
    personas: Personas, providers: None, fresh: None
) -> None:
    raw = orjson.dumps(BODY)

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        try:
            broker = broker_module.broker_get()
            await broker.store.bootstrap()  # a new deployment: no learning period
            client = Client(raw, stops_reading=True)
            await application(scope(raw, "order-cut"), client.receive, client.send)
            # Read at once, with no await in between: nothing else runs on this loop meanwhile.
            seen["sent"] = [m["type"] for m in client.sent]
            start = client.sent[0]
            seen["request id"] = dict(start["headers"])[b"x-request-id"].decode()
            store = gateway_redis.sync_client()
            seen["leases"] = [  # the request's own (not an allowance the process took)
                lease
                for lease in store.zrange(lease_index_key(broker.store.prefix), 0, -1)
                if seen["request id"].encode() in lease
            ]
            seen["keys"] = [
                store.hget(name, "state")
                for name in store.scan_iter(match=gateway_redis.key("idempotency", "*"))
            ]
            seen["ledger"] = [
                ledger.record_decode(record)
                for record in [
                    *ledger._buffer.records,
                    *ledger._buffer.kept(),
                ]
            ]
            retry = Client(raw, stops_reading=False)
            await application(scope(raw, "order-cut"), retry.receive, retry.send)
            seen["retry"] = retry.sent[0]["status"]
            return seen
        finally:
            await broker_module.broker_get().queue.close()
            await gateway_redis.async_client().aclose()
            await upstream.clients_close()

    seen = async_to_sync(scenario)()

    assert seen["sent"] == ["http.response.start", "http.response.body"]
    assert seen["leases"] == [], "the reservation is still leased"
    assert seen["keys"] == [], "the Idempotency-Key is still claimed"
    rows = [
        (row["status"], row["reason_code"], row["cancelled"])
        for row in seen["ledger"]
        if row["kind"] == "generation" and row["id"] == seen["request id"]
    ]
    assert rows == [(499, "client_disconnected", True)]
    assert seen["retry"] == 200, "the retry under the same key was not served"
