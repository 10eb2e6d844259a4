"""E3 Idempotency-Key: claim, replay, 422 on another body, give back after a failure, per app.

Against real Redis, under a key prefix of each test alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from django.test import RequestFactory
from hypothesis import given
from hypothesis import strategies as st

from common import redis as gateway_redis
from gateway import idempotency
from gateway.call import Call
from gateway.errors import IdempotencyConflict, IdempotencyKeyReused, InvalidRequest
from tenants.identity import Principal
from tests.personas import ACME_WEB, redis_prefix_scope

T = TypeVar("T")

WEB = ACME_WEB
INDEXER = dataclasses.replace(WEB, key_id=2, app_id=12, app_name="indexer")  # same team
GLOBEX = dataclasses.replace(WEB, key_id=3, app_id=21, team_id=6, tenant_id=4, tenant_name="g")
BODY = idempotency.body_digest(b'{"model": "acme/chat-small", "messages": []}')
OTHER_BODY = idempotency.body_digest(b'{"model": "acme/chat-large", "messages": []}')
ANSWER = b'{"id": "gen-x", "choices": []}'


@pytest.fixture
def redis_prefix(settings: Any) -> Iterator[str]:
    yield from redis_prefix_scope(settings)


@pytest.fixture
def run(redis_prefix: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[Awaitable[T]], T]:
    """Run a coroutine on a fresh loop, with an async Redis client of that loop alone."""

    def runner(awaitable: Awaitable[T]) -> T:
        monkeypatch.setattr(gateway_redis, "_async_client", None)

        async def main() -> T:
            try:
                return await awaitable
            finally:
                await gateway_redis.async_client().aclose()

        return asyncio.run(main())

    return runner


def call(key: str = "order-1", principal: Principal = WEB, *, stream: bool = False) -> Call:
    return Call(principal=principal, idempotency_key=key, stream=stream)


def header_request(value: str | None) -> Any:
    headers = {} if value is None else {"Idempotency-Key": value}
    return RequestFactory().post("/v1/chat/completions", headers=headers)


# --- request_key ---------------------------------------------------------------------------


def test_it_reads_no_key_as_empty() -> None:
    assert idempotency.request_key(header_request(None)) == ""


@given(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=255))
def test_it_takes_any_printable_ascii_key_up_to_255_characters_whole(value: str) -> None:
    assert idempotency.request_key(header_request(value)) == value


@pytest.mark.parametrize(
    "value", ["k" * 256, "k" * 5000, "order-é", "order-\x01", "order-\x7f", "order-\u2603"]
)
def test_it_refuses_a_key_too_long_or_not_printable_ascii(value: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        idempotency.request_key(header_request(value))

    assert refused.value.status == 400
    assert refused.value.param == "Idempotency-Key"
    assert "Idempotency-Key" in refused.value.message


def test_it_tells_keys_apart_that_differ_only_after_200_characters(run: Any) -> None:
    base = "k" * 250

    async def scenario() -> tuple[Any, Any]:
        return await idempotency.claim(call(base + "1"), BODY), await idempotency.claim(
            call(base + "2"), BODY
        )

    assert run(scenario()) == (None, None)


# --- claim ---------------------------------------------------------------------------------


def test_it_lets_a_request_without_a_key_through_without_touching_redis(run: Any) -> None:
    async def scenario() -> list[Any]:
        first, second = call(""), call("")
        return [await idempotency.claim(first, BODY), await idempotency.claim(second, BODY)]

    assert run(scenario()) == [None, None]
    assert not list(gateway_redis.sync_client().scan_iter(match=f"{gateway_redis.key('*')}"))


def test_it_keeps_working_after_redis_forgets_its_scripts(run: Any) -> None:
    first, repeat = call(), call()

    async def scenario() -> Any:
        await idempotency.claim(first, BODY)
        await gateway_redis.async_client().script_flush()  # as after a Redis restart
        await idempotency.remember(first, 200, ANSWER, {})
        return await idempotency.claim(repeat, BODY)

    replay = run(scenario())
    assert replay.status_code == 200 and replay.content == ANSWER


def test_it_refuses_a_repeat_while_the_first_is_in_flight_naming_it(run: Any) -> None:
    first, repeat = call(), call()

    async def scenario() -> IdempotencyConflict:
        assert await idempotency.claim(first, BODY) is None
        with pytest.raises(IdempotencyConflict) as conflict:
            await idempotency.claim(repeat, BODY)
        return conflict.value

    conflict = run(scenario())
    assert (conflict.status, conflict.code) == (409, "idempotency_conflict")
    assert first.id in conflict.message
    assert conflict.headers[idempotency.ORIGINAL_HEADER] == first.id


def test_it_lets_exactly_one_of_many_concurrent_firsts_claim(run: Any) -> None:
    calls = [call() for _ in range(50)]

    async def scenario() -> list[Any]:
        return await asyncio.gather(
            *(idempotency.claim(c, BODY) for c in calls), return_exceptions=True
        )

    results = run(scenario())
    assert results.count(None) == 1
    assert all(isinstance(r, IdempotencyConflict) for r in results if r is not None)
    winner = calls[results.index(None)]
    assert all(winner.id in r.message for r in results if r is not None)


def test_it_replays_the_delivered_answer_with_its_status_body_and_headers(run: Any) -> None:
    first = call()
    headers = {
        "Content-Type": "application/json",
        "x-request-id": first.id,
        "x-switchyard-provider": "alpha",
        "Content-Length": "999",  # describes the first transfer: not replayed
    }

    async def scenario() -> Any:
        assert await idempotency.claim(first, BODY) is None
        await idempotency.remember(first, 200, ANSWER, headers)
        return await idempotency.claim(call(), BODY), await idempotency.claim(call(), BODY)

    for replay in run(scenario()):
        assert replay.status_code == 200
        assert replay.content == ANSWER
        assert replay["Idempotent-Replayed"] == "true"
        assert replay["Content-Type"] == "application/json"
        assert (replay["x-request-id"], replay["x-switchyard-provider"]) == (first.id, "alpha")
        assert replay.get("Content-Length") in (None, str(len(ANSWER)))


def test_it_replays_a_delivered_answer_of_another_status_as_it_was(run: Any) -> None:
    first = call()

    async def scenario() -> Any:
        await idempotency.claim(first, BODY)
        await idempotency.remember(first, 201, b"", {})
        return await idempotency.claim(call(), BODY)

    replay = run(scenario())
    assert (replay.status_code, replay.content, replay["Idempotent-Replayed"]) == (201, b"", "true")


@pytest.mark.parametrize("answered", [False, True], ids=["in flight", "answered"])
def test_it_refuses_the_same_key_with_another_body_with_422(run: Any, answered: bool) -> None:
    first = call()

    async def scenario() -> IdempotencyKeyReused:
        await idempotency.claim(first, BODY)
        if answered:
            await idempotency.remember(first, 200, ANSWER, {})
        with pytest.raises(IdempotencyKeyReused) as reused:
            await idempotency.claim(call(), OTHER_BODY)
        return reused.value

    reused = run(scenario())
    assert (reused.status, reused.code, reused.type) == (
        422,
        "idempotency_key_reused",
        "invalid_request_error",
    )
    assert reused.param == "Idempotency-Key"
    assert first.id in reused.message


def test_it_refuses_a_repeat_of_a_delivered_stream_naming_its_generation(run: Any) -> None:
    first = call(stream=True)

    async def scenario() -> IdempotencyConflict:
        await idempotency.claim(first, BODY)
        await idempotency.remember(first, 200, b"", {})
        with pytest.raises(IdempotencyConflict) as conflict:
            await idempotency.claim(call(stream=True), BODY)
        return conflict.value

    conflict = run(scenario())
    assert conflict.status == 409
    assert f"/v1/generation?id={first.id}" in conflict.message
    assert "streamed" in conflict.message


def test_it_refuses_a_repeat_of_an_answer_too_large_to_store_naming_its_generation(
    run: Any,
) -> None:
    first = call()
    large = b"x" * (idempotency.MAX_REPLAY_BYTES + 1)

    async def scenario() -> IdempotencyConflict:
        await idempotency.claim(first, BODY)
        await idempotency.remember(first, 200, large, {"Content-Type": "application/json"})
        with pytest.raises(IdempotencyConflict) as conflict:
            await idempotency.claim(call(), BODY)
        return conflict.value

    conflict = run(scenario())
    assert f"/v1/generation?id={first.id}" in conflict.message
    stored = gateway_redis.sync_client().hget(idempotency._key(first), "content")
    assert stored == b""


def test_it_keeps_a_delivered_answer_for_the_configured_ttl(run: Any, settings: Any) -> None:
    settings.IDEMPOTENCY_TTL_SECONDS = 3600
    first = call()

    async def scenario() -> None:
        await idempotency.claim(first, BODY)
        await idempotency.remember(first, 200, ANSWER, {})

    run(scenario())
    ttl = gateway_redis.sync_client().ttl(idempotency._key(first))
    assert 3590 < ttl <= 3600


# --- release -------------------------------------------------------------------------------


@pytest.mark.parametrize("attempts", [0, 1, 6])
def test_it_gives_the_key_back_after_a_request_that_delivered_nothing(
    run: Any, attempts: int
) -> None:
    failed = call()
    failed.attempts = attempts  # refused early, or every provider failed, or the client left
    retry = call()

    async def scenario() -> Any:
        await idempotency.claim(failed, BODY)
        await idempotency.release(failed)
        return await idempotency.claim(retry, BODY)

    assert run(scenario()) is None
    owner = gateway_redis.sync_client().hget(idempotency._key(retry), "owner")
    assert owner == retry.id.encode()


def test_it_never_gives_back_a_key_that_delivered_an_answer(run: Any) -> None:
    first = call()

    async def scenario() -> Any:
        await idempotency.claim(first, BODY)
        await idempotency.remember(first, 200, ANSWER, {})
        await idempotency.release(first)
        return await idempotency.claim(call(), BODY)

    assert run(scenario())["Idempotent-Replayed"] == "true"


def test_it_never_gives_back_another_requests_claim(run: Any) -> None:
    holder, refused = call(), call()

    async def scenario() -> None:
        await idempotency.claim(holder, BODY)
        with pytest.raises(IdempotencyConflict):
            await idempotency.claim(refused, BODY)
        await idempotency.release(refused)  # the pipeline releases after every error
        with pytest.raises(IdempotencyConflict):
            await idempotency.claim(call(), BODY)

    run(scenario())


def test_it_never_stores_an_answer_under_a_claim_that_passed_to_another_request(
    run: Any,
) -> None:
    late, current = call(), call()

    async def scenario() -> Any:
        await idempotency.claim(late, BODY)
        gateway_redis.sync_client().delete(idempotency._key(late))  # its claim expired
        await idempotency.claim(current, BODY)
        await idempotency.remember(late, 200, ANSWER, {})
        with pytest.raises(IdempotencyConflict) as conflict:
            await idempotency.claim(call(), BODY)
        return conflict.value

    assert current.id in run(scenario()).message


# --- scope ---------------------------------------------------------------------------------


def test_it_scopes_keys_to_the_app_not_the_tenant(run: Any) -> None:
    web, indexer, globex = call(principal=WEB), call(principal=INDEXER), call(principal=GLOBEX)

    async def scenario() -> list[Any]:
        results = [await idempotency.claim(c, BODY) for c in (web, indexer, globex)]
        await idempotency.remember(web, 200, ANSWER, {})
        with pytest.raises(IdempotencyConflict) as conflict:  # indexer's own is in flight
            await idempotency.claim(call(principal=INDEXER), BODY)
        assert indexer.id in conflict.value.message
        results.append(await idempotency.claim(call(principal=WEB), BODY))
        return results

    *claims, replay = run(scenario())
    assert claims == [None, None, None]
    assert replay.content == ANSWER


def test_it_shares_a_key_between_two_api_keys_of_one_app(run: Any) -> None:
    other_key = dataclasses.replace(WEB, key_id=99, key_name="deploy")
    first = call(principal=WEB)

    async def scenario() -> Any:
        await idempotency.claim(first, BODY)
        await idempotency.remember(first, 200, ANSWER, {})
        return await idempotency.claim(call(principal=other_key), BODY)

    assert run(scenario()).content == ANSWER
