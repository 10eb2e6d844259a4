"""A request that raises anywhere after its grant leaves no reservation behind (issue 13, C9).

Each case injects one failure into one step of the spine — dispatch, the provider's answer,
reconcile, the ledger records, building the response, remembering the idempotent answer, the
stream relay — and then reads the real Redis store (once the process's allowances are
reconciled, ``broker_close``): no lease is left open, every concurrency slot is back, and a
failure before anything went out gave everything back. The caller gets a
500 in the envelope with its request id, the ledger has the row, and the Idempotency-Key is
free again. Providers answer from a loopback port (``tests.loopback_provider``).

Redis away as an answered attempt is settled is no bug but an outage: the answer goes out and
the grant is left to its lease (the last cases).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient
from redis.exceptions import ConnectionError as RedisConnectionError

from common import redis as gateway_redis
from gateway import ledger, pipeline, upstream
from gateway.errors import CapacityRefused
from gateway.models import Job
from gateway.snapshot import holder
from quotas import broker as broker_module
from quotas.core.keys import lease_index_key
from quotas.core.model import Rule
from routing import live
from tenants.models import ApiKey
from tests.loopback_provider import LoopbackProvider, providers_served_by
from tests.personas import ACME_KEY, Personas

PROVIDER_URLS = ("http://127.0.0.1:9101/v1", "http://127.0.0.1:9102", "http://127.0.0.1:9103/v1")
BODY = {"model": "acme/chat-small", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {
    "id": "up-1",
    "object": "chat.completion",
    "created": 1,
    "model": "chat-small",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


CHUNKS = sse(
    {
        "id": "up-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "chat-small",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hel"}}],
    },
    {
        "id": "up-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "chat-small",
        "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}],
    },
    {
        "id": "up-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "chat-small",
        "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    },
)


class Fault(Exception):
    """The injected failure (no step expects it)."""


def fail_once(real: Any) -> Any:
    """``real``, except that its first call raises (so the clean-up's own calls work)."""
    calls = {"n": 0}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise Fault("injected")
        return real(*args, **kwargs)

    return wrapper


def fail_once_async(real: Any) -> Any:
    calls = {"n": 0}

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise Fault("injected")
        return await real(*args, **kwargs)

    return wrapper


# (module or class, attribute, async?, sent?): "sent" — the provider got the call, so its
# request and estimated tokens stay counted; otherwise every bucket is back to full.
STEPS = {
    "dispatch": ("gateway.pipeline", "attempt_send", True, False),
    "provider answer": ("gateway.providers.openai.OpenAIAdapter", "parse_completion", False, True),
    "reconcile": ("quotas.broker.Broker", "reconcile", True, True),
    "reservation record": ("gateway.answers", "reservation_taken", False, True),
    "generation record": ("gateway.answers", "generation_record", False, True),
    "routing stats": ("gateway.answers", "answer_observe", False, True),
    "response building": ("gateway.answers", "json_response", False, True),
    # After the ledger row (status 200: the answer was made and paid for) went out.
    "idempotent answer": ("gateway.idempotency", "remember", True, True),
}
STREAM_STEPS = {
    "stream translator": ("gateway.providers.openai.OpenAIAdapter", "stream_translator", False),
    "stream relay": ("gateway.answers", "relay", False),
    "stream chunk": ("gateway.streaming", "_collect", False),
    "stream end": ("quotas.broker.Broker", "reconcile", True),
}


def target(path: str) -> Any:
    module, _, name = path.rpartition(".")
    if name[0].isupper():  # a class
        return getattr(__import__(module, fromlist=[name]), name)
    return __import__(path, fromlist=["_"])


@pytest.fixture
def providers(personas: Personas) -> Iterator[list[bytes]]:
    """The providers answer every call, from one loopback port; the bodies they received, in
    order."""

    def answer(body: bytes) -> httpx.Response:
        if orjson.loads(body).get("stream"):
            return httpx.Response(
                200, content=CHUNKS, headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=COMPLETION)

    with LoopbackProvider(answer) as served:
        providers_served_by(served, PROVIDER_URLS)
        yield served.received


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's loop gets its own Redis client, broker, router and snapshot."""
    monkeypatch.setattr(gateway_redis, "_async_client", None)
    monkeypatch.setattr(broker_module, "_broker", None)
    monkeypatch.setattr(live, "_live", None)
    holder.reset()


def serve(*, stream: bool, key: str = "order-1") -> dict[str, Any]:
    """Send one request twice (same Idempotency-Key) and read the store after each."""

    async def scenario() -> dict[str, Any]:
        client = AsyncClient()
        headers = {"authorization": f"Bearer {ACME_KEY}", "idempotency-key": key}
        body = {**BODY, "stream": stream}
        seen: dict[str, Any] = {}
        try:
            snapshot = await holder.get()
            specs = [b.spec for group in snapshot.quotas.buckets.values() for b in group]
            broker = broker_module.broker_get()
            await broker.store.bootstrap()  # a new deployment: no learning period
            seen["specs"], seen["before"] = specs, await broker.store.levels(specs)
            answer = await client.post(
                "/v1/chat/completions", body, content_type="application/json", headers=headers
            )
            seen["status"], seen["headers"] = answer.status_code, dict(answer.items())
            if answer.streaming:
                try:
                    seen["content"] = b"".join([part async for part in answer.streaming_content])
                except Fault:
                    seen["content"] = None
            else:
                seen["content"] = answer.content
            # The process's allowances (the request showed plenty left) are reconciled first:
            # what is left is the request's own.
            await broker_module.broker_close()
            seen["after"] = await broker.store.levels(specs)
            seen["leases"] = await gateway_redis.async_client().zcard(
                lease_index_key(broker.store.prefix)
            )
            await ledger.ledger_drain()
            queued = await gateway_redis.async_client().lrange(gateway_redis.key("ledger"), 0, -1)
            seen["ledger"] = [ledger.record_decode(item) for item in queued]
            again = await client.post(
                "/v1/chat/completions",
                {**BODY, "stream": False} if not stream else body,
                content_type="application/json",
                headers=headers,
            )
            seen["again"] = again.status_code
            return seen
        finally:
            await broker_module.broker_get().queue.close()
            await gateway_redis.async_client().aclose()
            await upstream.clients_close()

    try:
        return async_to_sync(scenario)()
    finally:
        holder.reset()


def assert_nothing_left_behind(seen: dict[str, Any], *, sent: bool) -> None:
    assert seen["leases"] == 0, "a lease is still open"
    for spec, before, after in zip(seen["specs"], seen["before"], seen["after"], strict=True):
        if not sent or spec.rule is Rule.CONCURRENCY:
            assert after.available == pytest.approx(before.available), spec.name


@pytest.mark.parametrize("step", STEPS)
def test_it_leaves_no_reservation_behind_whatever_step_raises(
    personas: Personas, providers: None, fresh: None, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    where, name, is_async, sent = STEPS[step]
    owner = target(where)
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, (fail_once_async if is_async else fail_once)(real))

    seen = serve(stream=False)

    assert seen["status"] == 500, seen["content"]
    error = orjson.loads(seen["content"])["error"]
    assert (error["type"], error["code"]) == ("api_error", "internal_error")
    request_id = seen["headers"]["x-request-id"]
    assert_nothing_left_behind(seen, sent=sent)
    rows = [r for r in seen["ledger"] if r.get("kind") == "generation" and r["id"] == request_id]
    assert [row["status"] for row in rows] == [200 if step == "idempotent answer" else 500]
    assert seen["again"] == 200, "the Idempotency-Key was given back"


@pytest.mark.parametrize("step", STREAM_STEPS)
def test_it_leaves_no_reservation_behind_whatever_step_of_a_stream_raises(
    personas: Personas, providers: None, fresh: None, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    where, name, is_async = STREAM_STEPS[step]
    owner = target(where)
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, (fail_once_async if is_async else fail_once)(real))

    seen = serve(stream=True)

    assert_nothing_left_behind(seen, sent=True)
    request_id = seen["headers"]["x-request-id"]
    rows = [r for r in seen["ledger"] if r.get("kind") == "generation" and r["id"] == request_id]
    assert [row["status"] for row in rows] == [500]
    assert seen["again"] == 200, "the Idempotency-Key was given back"


def redis_away_once(real: Any) -> Any:
    """``real``, except that its first call finds Redis gone (as the broker's store would)."""
    calls = {"n": 0}

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379.")
        return await real(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_answer_goes_out_when_redis_fails_as_its_grant_is_settled(
    personas: Personas,
    providers: list[bytes],
    fresh: None,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    # The provider answered (and charged): a 503 now would throw its answer away.
    monkeypatch.setattr(
        broker_module.Broker, "reconcile", redis_away_once(broker_module.Broker.reconcile)
    )

    seen = serve(stream=stream)

    assert seen["status"] == 200
    if stream:
        assert seen["content"].endswith(b"data: [DONE]\n\n")
        assert b'"content":"hel"' in seen["content"]
    else:
        assert orjson.loads(seen["content"])["choices"][0]["message"]["content"] == "hello"
    assert seen["leases"] == 1, "the grant is left to its lease (the reaper settles it)"
    request_id = seen["headers"]["x-request-id"]
    rows = [r for r in seen["ledger"] if r.get("kind") == "generation" and r["id"] == request_id]
    assert [row["status"] for row in rows] == [200]
    # The key remembers a delivered answer: a repeat gets it back (a stream: 409, naming it).
    assert seen["again"] == (409 if stream else 200)
    assert len(providers) == 1, "the repeat made no second call"


def test_a_job_whose_answer_meets_redis_away_as_it_is_settled_succeeds_with_one_call(
    personas: Personas,
    providers: list[bytes],
    fresh: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 13: the job running as Redis stopped ended 503 broker_unavailable although the
    provider had answered it; trying again would have paid for it twice."""
    monkeypatch.setattr(
        broker_module.Broker, "reconcile", redis_away_once(broker_module.Broker.reconcile)
    )
    key = ApiKey.objects.get(app__name="web", app__team__tenant=personas.acme, name="ci")
    now = dt.datetime.now(dt.UTC)
    job = Job.objects.create(
        id="job-answered-as-redis-went",
        generation_id="gen-answered-as-redis-went",
        created_at=now,
        deadline_at=now + dt.timedelta(minutes=30),
        tenant_id=personas.acme.pk,
        app_id=key.app_id,
        api_key_id=key.pk,
        workload_class="background",
        model=BODY["model"],
        request=BODY,
        tries=1,
    )

    async def attempt() -> Any:
        try:
            await broker_module.broker_get().store.bootstrap()
            return await pipeline.job_attempt(job, try_until=time.time() + 20, last_try=False)
        finally:
            await broker_module.broker_get().queue.close()
            await gateway_redis.async_client().aclose()
            await upstream.clients_close()

    try:
        answer = async_to_sync(attempt)()
    finally:
        holder.reset()

    assert not isinstance(answer, CapacityRefused), "it would call the provider again"
    assert answer.status_code == 200, answer.content
    assert orjson.loads(answer.content)["choices"][0]["message"]["content"] == "hello"
    assert len(providers) == 1
