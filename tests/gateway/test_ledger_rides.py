"""Background round trips ride an answer's ledger append (``gateway.ledger._append``): while
answers come, a process shares its routing statistics and takes the others'
(``LiveRouter.sync_ride``), and its heartbeat reads the broker's epoch and the pauses set
anywhere (``Recovery.look_ride``), with no round trip of their own; with no answer coming,
each goes alone once an interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import orjson
import pytest

from common import redis as sy_redis
from configfile.apply import config_load
from gateway import ledger
from quotas import recovery as recovery_module
from quotas.broker import Broker
from quotas.recovery import Recovery
from quotas.store.redis import RedisReservationStore
from routing import live as live_module
from routing.catalogue import catalogue_build
from routing.core.stats import Outcome
from routing.live import LiveRouter

CONFIG = """
providers:
  - {name: alpha, protocol: openai, base_url: "http://127.0.0.1:9/v1", api_key_env: ALPHA_KEY}
models:
  - slug: m
    endpoints:
      - {provider: alpha, upstream_model: up, price: {input: 1.0, output: 2.0}, context_window: 8000, max_output: 1000}
"""
ENDPOINT = "m@alpha"
INTERVAL = 0.3


@pytest.fixture
def shared(
    tmp_path: Path, redis_prefix: str, settings: object, monkeypatch: pytest.MonkeyPatch
) -> tuple[LiveRouter, LiveRouter, list[str]]:
    """Two processes' routers on one catalogue; this one is the ledger's, and each sync it
    sends on its own is counted."""
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    config_load(path, env={"ALPHA_KEY": "sk-alpha"})
    settings.ROUTING_SYNC_INTERVAL = INTERVAL  # type: ignore[attr-defined]
    monkeypatch.setattr(sy_redis, "_async_client", None)
    ours, theirs = LiveRouter("routing_cost"), LiveRouter("routing_cost")
    monkeypatch.setattr(live_module, "_live", ours)
    alone: list[str] = []
    sync = ours.sync

    async def counted() -> None:
        alone.append("sync")
        await sync()

    monkeypatch.setattr(ours, "sync", counted)
    return ours, theirs, alone


async def configured(*routers: LiveRouter) -> None:
    catalogue = await asyncio.to_thread(catalogue_build)
    for router in routers:
        router.configure(1, catalogue)


def ok(latency: float) -> Outcome:
    return Outcome("ok", latency_s=latency, output_tokens=50)


@pytest.mark.django_db(transaction=True)
def test_while_answers_come_the_sync_rides_their_appends(
    shared: tuple[LiveRouter, LiveRouter, list[str]], settings: object
) -> None:
    ours, theirs, alone = shared
    # A sync rides from 0.8 of the interval and goes alone at its end: with an answer every
    # 20 ms, 80 ms of a busy machine's delays are forgiven.
    interval = settings.ROUTING_SYNC_INTERVAL = 0.5  # type: ignore[attr-defined]

    async def main() -> tuple[dict[bytes, bytes], float]:
        try:
            await configured(ours, theirs)
            for _ in range(300):  # the other process saw many more attempts, and shared them
                theirs.observe(ENDPOINT, ok(2.0))
            await theirs.sync()
            started = time.monotonic()
            while time.monotonic() - started < 4 * interval:
                ours.observe(ENDPOINT, ok(0.4))
                await ledger._append([orjson.dumps({"kind": "test"})])
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.01)  # the last ride's replies are taken after its answer
            client = sy_redis.async_client()
            fields = await client.hgetall(sy_redis.key("routing", "ep", ENDPOINT))
            return fields, ours.router.stats[ENDPOINT]["n"]
        finally:
            await ours.close()
            await theirs.close()
            await sy_redis.async_client().aclose()

    fields, attempts = asyncio.run(main())
    assert alone == []  # not one round trip of its own
    assert ours.process.encode() in fields  # ours published, beside theirs
    assert theirs.process.encode() in fields
    # And took theirs: ours alone made at most 100 attempts (a 30 s half-life decays little).
    assert 250 < attempts < 420


@pytest.mark.django_db(transaction=True)
def test_with_no_answer_coming_it_syncs_alone_once_an_interval(
    shared: tuple[LiveRouter, LiveRouter, list[str]],
) -> None:
    ours, _, alone = shared

    async def main() -> dict[bytes, bytes]:
        try:
            await configured(ours)
            ours.observe(ENDPOINT, ok(0.4))
            await asyncio.sleep(3.5 * INTERVAL)
            client = sy_redis.async_client()
            return await client.hgetall(sy_redis.key("routing", "ep", ENDPOINT))
        finally:
            await ours.close()
            await sy_redis.async_client().aclose()

    fields = asyncio.run(main())
    assert alone in (["sync"] * 2, ["sync"] * 3)  # at 0.3, 0.6 and 0.9 s (a busy loop: later)
    assert ours.process.encode() in fields


def answers(seconds: float) -> Coroutine[Any, Any, None]:
    """An answer's ledger append every 50 ms for ``seconds``."""

    async def appending() -> None:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            await ledger._append([orjson.dumps({"kind": "test"})])
            await asyncio.sleep(0.05)

    return appending()


@pytest.mark.django_db(transaction=True)
def test_while_answers_come_the_heartbeat_looks_in_their_appends(
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """And a pause another process sets still reaches this one's allowances within a beat."""
    monkeypatch.setattr(sy_redis, "_async_client", None)
    looks_alone: list[str] = []

    async def main() -> tuple[int | None, int | None]:
        store = RedisReservationStore(sy_redis.async_client(), prefix=redis_prefix)
        broker = Broker(store, allowance_requests=8)
        heartbeat = Recovery(broker, "gateway")
        monkeypatch.setattr(recovery_module, "_current", heartbeat)
        look = store.recovery_look

        async def counted(*args: Any, **kwargs: Any) -> Any:
            looks_alone.append("look")
            return await look(*args, **kwargs)

        try:
            await heartbeat.join()  # its first look is its own
            monkeypatch.setattr(store, "recovery_look", counted)
            assert broker.allowances is not None
            before = broker.allowances._pauses
            await answers(2.5)
            await store.pause("provider:theta", time.time() + 60)  # another process's 429
            await answers(1.5)
            return before, broker.allowances._pauses
        finally:
            await heartbeat.leave()
            await sy_redis.async_client().aclose()

    before, after = asyncio.run(main())
    assert looks_alone == []
    assert before == 0 and after == 1  # the pause, seen by a look that rode an append
