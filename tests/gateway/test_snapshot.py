"""The per-process configuration snapshot: a change (a revoked key) applies to the first request
after the poll interval, on every worker, with one Redis GET per interval, shared."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.utils import timezone

from common import redis as gateway_redis
from gateway import ledger
from gateway import snapshot as snapshot_module
from gateway.snapshot import Snapshot, SnapshotHolder
from tenants.keys import key_hash
from tenants.models import ApiKey
from tests.personas import ACME_KEY, Personas


class CountingHolder(SnapshotHolder):
    """The real holder, counting its Redis reads of the configuration version."""

    def __init__(self) -> None:
        super().__init__()
        self.version_reads = 0

    async def _read_version(self) -> int:
        self.version_reads += 1
        return await super()._read_version()


@pytest.fixture
def loop_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each scenario's event loop gets its own async Redis client (closed in ``run``).
    monkeypatch.setattr(gateway_redis, "_async_client", None)


def run(scenario: Any) -> Any:
    """Run ``scenario`` so that the snapshot's database reads use this test's transaction."""

    async def closing() -> Any:
        try:
            return await scenario()
        finally:
            await gateway_redis.async_client().aclose()

    return async_to_sync(closing)()


def usable(snapshot: Snapshot) -> bool:
    return snapshot.keys.identify(ACME_KEY, now=timezone.now().timestamp()) is not None


def revoke(secret: str) -> None:
    """What the admin's revoke action does: the row changes, the version moves on commit."""
    ApiKey.objects.filter(secret_hash=key_hash(secret)).update(revoked_at=timezone.now())
    gateway_redis.config_version_bump()


def test_it_refuses_a_revoked_key_on_the_first_request_after_the_interval(
    personas: Personas, settings: Any, loop_redis: None
) -> None:
    settings.CONFIG_POLL_INTERVAL = 60.0
    holder = CountingHolder()

    async def scenario() -> list[bool]:
        before = usable(await holder.get())
        await sync_to_async(revoke)(ACME_KEY)
        within = usable(await holder.get())  # inside the interval: as it was, no Redis call
        reads_within = holder.version_reads
        settings.CONFIG_POLL_INTERVAL = 0.0  # the interval has passed (the worker sat idle)
        after = usable(await holder.get())
        return [before, within, reads_within == 1, after]

    assert run(scenario) == [True, True, True, False]


def test_it_shares_one_version_check_and_one_rebuild_among_concurrent_requests(
    personas: Personas, settings: Any, loop_redis: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.CONFIG_POLL_INTERVAL = 60.0
    holder = CountingHolder()
    builds: list[int] = []
    real_build = snapshot_module.snapshot_build

    def counted_build(version: int) -> Snapshot:
        builds.append(version)
        return real_build(version)

    monkeypatch.setattr(snapshot_module, "snapshot_build", counted_build)

    async def scenario() -> tuple[int, int, set[int]]:
        first = await holder.get()
        gateway_redis.config_version_bump()
        settings.CONFIG_POLL_INTERVAL = 0.0
        burst = await asyncio.gather(*(holder.get() for _ in range(20)))
        settings.CONFIG_POLL_INTERVAL = 60.0
        again = await asyncio.gather(*(holder.get() for _ in range(20)))
        return first.version, holder.version_reads, {s.version for s in burst + again}

    first, reads, versions = run(scenario)

    assert reads == 2  # the first build's and the burst's, none within the interval
    assert len(builds) == 2
    assert versions == {first + 1}


def test_it_serves_the_last_snapshot_when_the_version_cannot_be_read(
    personas: Personas, settings: Any, loop_redis: None
) -> None:
    settings.CONFIG_POLL_INTERVAL = 0.0

    class Unreachable(CountingHolder):
        async def _read_version(self) -> int:
            if self.version_reads:
                self.version_reads += 1
                raise ConnectionError("redis is down")
            return await super()._read_version()

    holder = Unreachable()

    async def scenario() -> tuple[bool, int]:
        first = await holder.get()
        return await holder.get() is first, holder.version_reads

    assert run(scenario) == (True, 2)


def test_a_version_a_ledger_append_read_stands_for_the_check(
    personas: Personas, settings: Any, loop_redis: None
) -> None:
    """Answers appended one by one read the version in their own round trips: the poll needs
    no GET of its own while they read the snapshot's version, and the next request rebuilds
    when they read a newer one, the interval notwithstanding."""
    settings.CONFIG_POLL_INTERVAL = 0.3
    holder = CountingHolder()

    async def scenario() -> list[Any]:
        first = await holder.get()
        await asyncio.sleep(0.35)  # the interval has passed
        await ledger._append([])
        same = await holder.get()
        reads_while_appending = holder.version_reads
        await asyncio.sleep(0.35)
        stale = await holder.get()  # no append since: a GET of its own
        reads_without = holder.version_reads
        await sync_to_async(revoke)(ACME_KEY)
        await ledger._append([])  # within the interval, reads the new version
        after = await holder.get()
        return [same is first, reads_while_appending, stale is first, reads_without,
                usable(after), after.version == first.version + 1]  # fmt: skip

    assert run(scenario) == [True, 1, True, 2, False, True]
