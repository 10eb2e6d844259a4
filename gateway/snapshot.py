"""The per-process configuration snapshot: keys, catalogue, quotas — no database on the hot path.

Each process holds one immutable snapshot and checks a version number in Redis at most every
CONFIG_POLL_INTERVAL seconds. The first request after the interval waits for that check, and
when the version moved (loadconfig or an admin save bumped it) for the new snapshot, so a
change (a revoked key) applies to every request from then on, even on a worker that was idle.
Within the interval requests use the snapshot as it is, with no Redis call. Every ledger append
reads the version too (gateway/ledger.py): a read of the same version there counts as a check,
so a process appending its answers' records needs no GET of its own, and a newer one is taken
up by the next request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass

from django.conf import settings

from common import redis as sy_redis
from common.db import database_work
from common.faultlog import faults
from gateway import ledger
from quotas.snapshot import QuotaSnapshot, quota_snapshot_build
from routing.catalogue import Catalogue, catalogue_build
from tenants.identity import KeyIndex, key_index_build

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    version: int
    keys: KeyIndex
    catalogue: Catalogue
    quotas: QuotaSnapshot


def snapshot_build(version: int) -> Snapshot:
    return Snapshot(
        version=version,
        keys=key_index_build(),
        catalogue=catalogue_build(),
        quotas=quota_snapshot_build(),
    )


class SnapshotHolder:
    """This process's snapshot, checked against Redis at most once per poll interval."""

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._checked_at = 0.0
        self._refreshing: asyncio.Task[None] | None = None
        self._ledger_read: tuple[int, float] | None = None  # the last one taken as a check

    async def get(self) -> Snapshot:
        """The current snapshot. Once the poll interval has passed, the request waits for the
        version check (one Redis GET) and any rebuild: a revoked key or a new limit applies to
        the very next request, not to the one after a background refresh. Requests arriving
        meanwhile wait for that same refresh."""
        refreshing = self._refreshing
        # A refresh left pending by another event loop (tests) cannot be awaited on this one.
        if (
            refreshing is None
            or refreshing.done()
            or refreshing.get_loop() is not asyncio.get_running_loop()
        ):
            snapshot = self._snapshot
            read = ledger.config_version_read()
            if snapshot is not None and read is not None and read is not self._ledger_read:
                self._ledger_check(snapshot, read)
            fresh = time.monotonic() - self._checked_at < settings.CONFIG_POLL_INTERVAL
            if snapshot is not None and fresh:
                return snapshot  # the hot path: no await at all
            refreshing = self._refreshing = asyncio.create_task(self._refresh())
        # Shielded: a request that gives up does not cancel the refresh the others wait for.
        await asyncio.shield(refreshing)
        assert self._snapshot is not None  # else the refresh raised
        return self._snapshot

    def _ledger_check(self, snapshot: Snapshot, read: tuple[int, float]) -> None:
        """The ledger's last append read the version; sent after this holder's last check, it
        is a check made then. A version other than this snapshot's makes the refresh come now,
        not when the interval is over."""
        self._ledger_read = read
        version, sent = read
        if sent > self._checked_at:
            self._checked_at = sent if version == snapshot.version else -math.inf

    def peek(self) -> Snapshot | None:
        """The snapshot held now, without any check (the readiness probe compares versions)."""
        return self._snapshot

    async def recheck(self) -> Snapshot:
        """The snapshot after a version check made now, the poll interval notwithstanding."""
        self._checked_at = 0.0
        return await self.get()

    async def _read_version(self) -> int:
        raw = await sy_redis.async_client().get(sy_redis.key("config", "version"))
        return int(raw or 0)

    async def _refresh(self) -> None:
        current = self._snapshot
        try:
            version = await self._read_version()
            if current is None or version != current.version:
                self._snapshot = await database_work(snapshot_build)(version)
        except Exception:
            if current is None:
                raise  # nothing to serve: the request fails, the next one tries again
            # Keep serving the last good configuration; the next poll tries again.
            faults.warning(log, "snapshot:refresh", "configuration snapshot refresh failed")
        finally:
            self._checked_at = time.monotonic()

    def reset(self) -> None:
        """Forget the snapshot (tests that change configuration without Redis)."""
        self._snapshot = None
        self._checked_at = 0.0
        self._refreshing = None


holder = SnapshotHolder()
