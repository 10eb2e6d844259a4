"""Health probes (issue 14): /healthz says the process is alive, /readyz whether it can serve,
following Redis going away and coming back within 2 s."""

import os
import shutil
import time

import httpx
import pytest
import redis
import yaml

from quotas.store.library import library_code
from tests.e2e.test_redis_restart import CONFIG, MARKET, RedisServer
from tests.stack import Stack

pytestmark = pytest.mark.e2e


def test_healthz_and_readyz_answer_without_credentials(stack):
    alive = httpx.get(f"{stack.base_url}/healthz", timeout=5)
    ready = httpx.get(f"{stack.base_url}/readyz", timeout=5)
    head = httpx.head(f"{stack.base_url}/readyz", timeout=5)
    post = httpx.post(f"{stack.base_url}/healthz", timeout=5)

    assert (alive.status_code, alive.json()) == (200, {"status": "ok"})
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ok",
        "checks": {"redis": "ok", "scripts": "ok", "config": "ok", "database": "ok"},
    }
    assert ready.headers["cache-control"] == "no-store"
    assert head.status_code == 200 and head.content == b""
    assert post.status_code == 405 and post.json()["error"]["code"] == "method_not_allowed"


@pytest.fixture
def own_redis_stack(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path)
    server.start()
    (tmp_path / "market.yaml").write_text(yaml.safe_dump(MARKET))
    (tmp_path / "switchyard.yaml").write_text(yaml.safe_dump(CONFIG))
    stack = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=server.url,
        market=tmp_path / "market.yaml",
        config=tmp_path / "switchyard.yaml",
        celery=False,
    )
    try:
        yield stack.start(), server
    finally:
        stack.stop()
        server.kill()


def _seconds_until(stack, status, *, limit=10.0):
    """Seconds until /readyz answers ``status`` (probing every 50 ms), and its last body."""
    started = time.monotonic()
    while True:
        try:
            response = httpx.get(f"{stack.base_url}/readyz", timeout=3)
            if response.status_code == status:
                return time.monotonic() - started, response.json()
        except httpx.HTTPError:
            pass
        assert time.monotonic() - started < limit, f"/readyz never answered {status}"
        time.sleep(0.05)


def test_readyz_follows_redis_stopping_and_starting(own_redis_stack):
    stack, server = own_redis_stack
    assert httpx.get(f"{stack.base_url}/readyz", timeout=5).status_code == 200

    server.kill()
    down_after, down = _seconds_until(stack, 503)
    server.start()  # empty: no configuration version, no scripts
    up_after, up = _seconds_until(stack, 200)

    print(
        f"/readyz: 503 {down_after:.3f} s after Redis stopped, 200 {up_after:.3f} s after it started"
    )
    assert down_after < 2.0
    assert up_after < 2.0
    assert down["status"] == "unavailable"
    assert down["checks"]["redis"] != "ok" and down["checks"]["database"] == "ok"
    assert up["checks"]["scripts"] == "ok"
    # The scripts (the function library) are in the new Redis before any request needed them.
    digest, _ = library_code()
    assert redis.Redis(port=server.port).function_list(library=f"switchyard_{digest}")
