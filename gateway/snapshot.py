"""The per-process configuration snapshot: keys, catalogue, quotas — no database on the hot path.

Each process holds one immutable snapshot and checks a version number in Redis at most every
CONFIG_POLL_INTERVAL seconds. When the version moved (loadconfig or an admin save bumped it), a
new snapshot is built in the background and swapped in; requests keep using the old one until
then. Only the very first request of a process waits for a build.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings

from gateway import redis as sy_redis
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
    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._checked_at = 0.0
        self._rebuild: asyncio.Task[None] | None = None
        self._first_build = asyncio.Lock()

    async def get(self) -> Snapshot:
        snapshot = self._snapshot
        if snapshot is None:
            async with self._first_build:
                if self._snapshot is None:
                    version = await self._read_version()
                    self._snapshot = await sync_to_async(snapshot_build)(version)
                    self._checked_at = time.monotonic()
            assert self._snapshot is not None
            return self._snapshot
        if time.monotonic() - self._checked_at >= settings.CONFIG_POLL_INTERVAL:
            self._checked_at = time.monotonic()
            if self._rebuild is None or self._rebuild.done():
                self._rebuild = asyncio.create_task(self._refresh(snapshot.version))
        return snapshot

    async def _read_version(self) -> int:
        raw = await sy_redis.async_client().get(sy_redis.key("config", "version"))
        return int(raw or 0)

    async def _refresh(self, seen: int) -> None:
        try:
            version = await self._read_version()
            if version != seen:
                self._snapshot = await sync_to_async(snapshot_build)(version)
        except Exception:
            # Keep serving the last good configuration; the next poll tries again.
            log.exception("configuration snapshot refresh failed")

    def reset(self) -> None:
        """Forget the snapshot (tests that change configuration without Redis)."""
        self._snapshot = None
        self._checked_at = 0.0


holder = SnapshotHolder()
