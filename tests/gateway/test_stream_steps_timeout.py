"""A stream in steps whose provider stops sending (SPEC C10: an upstream timeout mid-stream)
is settled like any other ending: the steps it took are in its reservation, the settle comes
after the last of them, and its bucket counts the partial usage — nothing stays leased.

The real handler, broker, Redis and ledger run in-process (as in ``test_stream_cut``); the
provider streams from a loopback port (``tests.loopback_provider``), one word per write, and
then stops sending: the gateway's read timeout (made short here) ends the stream.
"""

from __future__ import annotations

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
from quotas.levels import broker_spec
from quotas.models import Bucket, WorkloadClass
from routing import live
from tests.gateway.test_stream_cut import PROVIDER_URLS, Client, chunk, scope
from tests.loopback_provider import LoopbackProvider, providers_served_by
from tests.personas import Personas

STEP = 4
WORDS = 30  # each " flow" (5 characters): about 1.25 tokens as the relay estimates
BODY = {
    "model": "acme/chat-small",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 300,
    "stream": True,
}


READ_TIMEOUT = 0.5  # the gateway's UPSTREAM_READ_TIMEOUT in this test


def provider_stream() -> Iterator[bytes]:
    yield chunk({"role": "assistant", "content": ""})
    for _ in range(WORDS):
        time.sleep(0.005)  # paced: the steps' calls get their turn meanwhile
        yield chunk({"content": " flow"})
    time.sleep(READ_TIMEOUT * 4)  # then nothing, past the gateway's read timeout


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test's loop gets its own Redis client, broker, router and snapshot."""
    monkeypatch.setattr(gateway_redis, "_async_client", None)
    monkeypatch.setattr(broker_module, "_broker", None)
    monkeypatch.setattr(live, "_live", None)
    holder.reset()
    yield
    holder.reset()


@pytest.fixture
def providers(personas: Personas, settings: Any) -> Iterator[None]:
    settings.UPSTREAM_READ_TIMEOUT = READ_TIMEOUT

    def answer(body: bytes) -> httpx.Response:
        return httpx.Response(
            200, content=provider_stream(), headers={"content-type": "text/event-stream"}
        )

    with LoopbackProvider(answer) as served:
        providers_served_by(served, PROVIDER_URLS)
        yield


def test_a_stream_in_steps_cut_by_an_upstream_timeout_settles_its_steps_and_partial_usage(
    personas: Personas, providers: None, fresh: None
) -> None:
    WorkloadClass.objects.filter(name="interactive").update(
        stream_reservation="increments", stream_step_tokens=STEP
    )
    tenant_tokens = Bucket.objects.get(name="tenant:acme:total_tokens:day")
    raw = orjson.dumps(BODY)

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        try:
            broker = broker_module.broker_get()
            await broker.store.bootstrap()
            client = Client(raw, stops_reading=False)
            await application(scope(raw, "order-timeout"), client.receive, client.send)
            start = client.sent[0]
            seen["headers"] = dict(start["headers"])
            seen["body"] = b"".join(m.get("body", b"") for m in client.sent[1:])
            store = gateway_redis.sync_client()
            seen["leases"] = store.zcard(lease_index_key(broker.store.prefix))
            seen["ledger"] = [
                ledger.record_decode(record)
                for record in [
                    *ledger._buffer.records,
                    *ledger._buffer.kept(),
                ]
            ]
            [level] = await broker.store.levels([broker_spec(tenant_tokens)])
            seen["available"] = level.available
            return seen
        finally:
            await broker_module.broker_get().queue.close()
            await gateway_redis.async_client().aclose()
            await upstream.clients_close()

    seen = async_to_sync(scenario)()

    assert seen["headers"][b"x-switchyard-stream-reservation"] == b"increments"
    assert seen["headers"][b"x-switchyard-reserved-output-tokens"] == str(STEP).encode()
    assert b"The provider stopped sending." in seen["body"]
    assert seen["leases"] == 0, "the reservation is still leased"
    request_id = seen["headers"][b"x-request-id"].decode()
    [generation] = [
        r for r in seen["ledger"] if r["kind"] == "generation" and r["id"] == request_id
    ]
    assert (generation["status"], generation["reason_code"]) == (504, "upstream_timeout")
    [reservation] = [
        r for r in seen["ledger"] if r["kind"] == "reservation" and r["request_id"] == request_id
    ]
    assert reservation["outcome"] == "reconciled"
    used = reservation["actual_input_tokens"] + reservation["actual_output_tokens"]
    # Its steps are in what it took (more than the first step's output)...
    assert reservation["taken"][tenant_tokens.name] > reservation["estimated_input_tokens"] + STEP
    # ... and the bucket counts exactly the partial usage settled against them.
    assert reservation["actual_output_tokens"] == -(-WORDS * 5 // 4)
    assert seen["available"] == tenant_tokens.capacity - used
