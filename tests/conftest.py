import os
import socket
import threading

import pytest
from django.db import connections
from hypothesis import settings

from tests.stack import Stack, static_collect_once

# Property tests check behaviour, not speed (benchmarks do that): hypothesis's default 200 ms
# deadline per example failed a trivial test once with the 2 cores at load ~10 beside e2e stacks.
settings.register_profile("switchyard", deadline=None)
settings.load_profile("switchyard")

E2E_UPSTREAM_READ_TIMEOUT = 3.0


class Blackhole:
    """A TCP listener that accepts connections and never answers: an upstream that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


class ClosedPort:
    """A port nothing answers on: bound and never listening, so a connection is refused. Held
    for the session: a port only found free once (bound, then let go) was taken by a server a
    later test started on an ephemeral port, and the "unreachable" provider answered (a 400
    from a test's loopback provider, in CI)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


def e2e_config(blackhole_port: int, closed_port: int):
    """The reference config plus what only tests need (added, never changed)."""

    def edit(config: dict) -> None:
        config["providers"] += [
            {
                "name": "unreachable",
                "protocol": "openai",
                "base_url": f"http://127.0.0.1:{closed_port}/v1",
            },
            {
                "name": "hanging",
                "protocol": "openai",
                "base_url": f"http://127.0.0.1:{blackhole_port}/v1",
            },
        ]
        beta_large = {
            "provider": "beta",
            "upstream_model": "chat-large-fast",
            "price": {"input": 0.80, "cached_input": 0.08, "output": 2.40},
            "context_window": 200000,
            "max_output": 8192,
            "supports": ["tools", "stream"],
        }
        config["models"] += [
            # Served only by the Anthropic-protocol provider, so tests reach both protocols.
            {
                "slug": "e2e/anthropic-large",
                "default_output_tokens": 300,
                "endpoints": [beta_large],
            },
            {"slug": "e2e/unreachable", "endpoints": [_endpoint("unreachable")]},
            {"slug": "e2e/hanging", "endpoints": [_endpoint("hanging")]},
        ]
        acme_web = config["tenants"][0]["teams"][0]["apps"][0]
        acme_web["keys"] += [
            {
                "name": "small-only",
                "secret": "sk-sy-test-acme-small-only",
                "allowed_models": ["acme/chat-small"],
            },
            {
                "name": "expired",
                "secret": "sk-sy-test-acme-expired-01",
                "expires_at": "2020-01-01T00:00:00Z",
            },
            {"name": "revocable", "secret": "sk-sy-test-acme-revocable-1"},
        ]

    return edit


def _endpoint(provider: str) -> dict:
    return {
        "provider": provider,
        "upstream_model": "chat-small",
        "price": {"input": 0.1, "cached_input": 0.1, "output": 0.1},
        "context_window": 32768,
        "max_output": 4096,
    }


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's, and before it drops the test databases: every other session on them
    ended. Some session stayed open to the end of the run (a connection of another thread or
    task of this process: which one is not known), and PostgreSQL refuses to drop a database
    in use: the run ended with a warning and the database was left behind."""
    yield
    with django_db_blocker.unblock():
        for connection in connections.all():
            if connection.vendor != "postgresql":
                continue
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            connection.close()


@pytest.fixture(scope="session", autouse=True)
def _static_collected() -> None:
    """Admin pages rendered in-process name the collected, hashed files, as in production."""
    static_collect_once()


@pytest.fixture(scope="session")
def stack():
    """The reference deployment, really started: simulator, gateway (uvicorn), Celery worker."""
    blackhole, closed = Blackhole(), ClosedPort()
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        latency_scale=0.05,
        config_edit=e2e_config(blackhole.port, closed.port),
        extra_env={"UPSTREAM_READ_TIMEOUT": str(E2E_UPSTREAM_READ_TIMEOUT)},
    )
    try:
        yield running.start()
    finally:
        running.stop()
        blackhole.close()
        closed.close()
