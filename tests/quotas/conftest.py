"""Fixtures for quota tests: a real Redis (shared dev Redis, unique key prefix per test), a
private redis-server that tests may flush or restart, and one adapter that runs either
store's async interface synchronously, so the contract suite is written once."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from quotas.store.memory import AsyncMemoryStore, MemoryReservationStore
from quotas.store.redis import RedisReservationStore
from tests.personas import Personas, personas_create, redis_prefix_scope

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unique_prefix() -> str:
    return f"sytest-{uuid.uuid4().hex[:12]}"


def delete_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key prefix of its own whose epoch is past its learning period (concurrency and
    window limits grant at once); its keys are deleted afterwards. A module that needs a new
    epoch (the broker's recovery) defines its own."""
    p = unique_prefix()
    redis.Redis.from_url(REDIS_URL).hset(f"{p}:epoch", mapping={"born": "0", "until": "0"})
    yield p
    delete_prefix(REDIS_URL, p)


class RedisServer:
    """A private redis-server on a free loopback port, without persistence."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.binary = binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


class SyncStore:
    """Runs any ``ReservationStore`` synchronously: the one adapter for both stores."""

    def __init__(self, store: Any, runner: asyncio.Runner, lose_state: Callable[[], None]):
        self.store = store
        self.runner = runner
        self.lose_state = lose_state

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.runner.run(method(*args, **kwargs))

        return call


def make_store(
    kind: str, runner: asyncio.Runner, **options: Any
) -> tuple[SyncStore, Callable[[], None]]:
    """A fresh store of ``kind`` and a cleanup function."""
    if kind == "memory":
        memory = MemoryReservationStore(**options)
        return SyncStore(AsyncMemoryStore(memory), runner, memory.lose_state), lambda: None
    prefix = unique_prefix()
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    store = RedisReservationStore(client, prefix=prefix, **options)
    runner.run(store.bootstrap())

    def cleanup() -> None:
        runner.run(client.aclose())
        delete_prefix(REDIS_URL, prefix)

    # Deleting every key of the prefix, epoch included, is what a restart does to this store.
    return SyncStore(store, runner, lambda: delete_prefix(REDIS_URL, prefix)), cleanup


@pytest.fixture(params=["memory", "redis"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(store_kind: str, runner: asyncio.Runner) -> Iterator[SyncStore]:
    s, cleanup = make_store(store_kind, runner, lease_seconds=30.0, retention_seconds=300.0)
    try:
        yield s
    finally:
        cleanup()


@pytest.fixture
def personas(db: None, settings: Any) -> Iterator[Personas]:
    """The reference configuration in the database, under a Redis prefix of this test alone."""
    yield from _with_prefix(settings)


def _with_prefix(settings: Any) -> Iterator[Personas]:
    prefix = redis_prefix_scope(settings)
    next(prefix)
    try:
        yield personas_create()
    finally:
        next(prefix, None)
