"""Redis restarted empty under load (issue 3): no request fails with a script error, and
while the broker relearns, admissions stay within capacity counting requests still in flight.

The stack gets a Redis server of its own, killed and started again empty mid-test; its leases
are short (3 s) so the learning period fits in the test.
"""

import asyncio
import os
import shutil
import signal
import subprocess
import time

import httpx
import pytest
import redis
import yaml

from tests.stack import Stack, free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONCURRENCY = 6
KEY = "sk-sy-test-restart-0001"
MARKET = {
    "providers": [
        {
            "name": "theta",
            "port": 9301,
            "protocol": "openai",
            "limits": {"concurrency": CONCURRENCY},
            "models": {
                "m": {
                    "ttft_ms": {"median": 50, "p95": 100},
                    "tokens_per_s": {"median": 40, "p05": 30},
                    "error_rate": 0.0,
                }
            },
        }
    ]
}
CONFIG = {
    "providers": [
        {
            "name": "theta",
            "protocol": "openai",
            "base_url": "http://127.0.0.1:9301/v1",
            "api_key_env": "ALPHA_API_KEY",
            "limits": [{"dimension": "concurrency", "capacity": CONCURRENCY}],
        }
    ],
    "models": [
        {
            "slug": "restart/m",
            "endpoints": [
                {
                    "provider": "theta",
                    "upstream_model": "m",
                    "price": {"input": 1.0, "output": 1.0},
                    "context_window": 100000,
                    "max_output": 4096,
                }
            ],
        }
    ],
    "workload_classes": [
        {"name": "interactive", "deadline": "2s", "max_queue_depth": 100, "overload": "reject"}
    ],
    "tenants": [
        {
            "name": "solo",
            "teams": [
                {
                    "name": "t",
                    "apps": [
                        {
                            "name": "a",
                            "default_workload": "interactive",
                            "keys": [{"name": "k", "secret": KEY}],
                        }
                    ],
                }
            ],
        }
    ],
}


class RedisServer:
    def __init__(self, folder):
        self.port = free_port()
        self.folder = folder
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server"),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
        )
        wait_until(self._answers, timeout=10, what="redis-server")

    def _answers(self):
        try:
            return redis.Redis(port=self.port).ping()
        except redis.ConnectionError:
            return False

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"


@pytest.fixture
def restart_stack(tmp_path):
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
        extra_env={"RESERVATION_LEASE_SECONDS": "3"},
    )
    try:
        yield stack.start(), server
    finally:
        stack.stop()
        server.kill()


def test_it_survives_redis_restarting_empty_under_load(restart_stack):
    stack, server = restart_stack
    payload = {
        "model": "restart/m",
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 80,
        "stream": True,
    }

    async def client(results, stop_at):
        async with httpx.AsyncClient(timeout=30) as http:
            while time.monotonic() < stop_at:
                try:
                    async with http.stream(
                        "POST",
                        f"{stack.base_url}/v1/chat/completions",
                        headers={"Authorization": f"Bearer {KEY}"},
                        json=payload,
                    ) as response:
                        body = await response.aread()
                        results.append((response.status_code, body))
                except httpx.HTTPError as exc:
                    results.append((0, repr(exc).encode()))
                if results[-1][0] != 200:
                    await asyncio.sleep(0.05)

    async def load():
        results = []
        stop_at = time.monotonic() + 12
        clients = [asyncio.create_task(client(results, stop_at)) for _ in range(10)]
        await asyncio.sleep(3)  # streams in flight, holding every slot
        await asyncio.to_thread(server.kill)
        await asyncio.to_thread(server.start)  # empty: no data, no scripts
        await asyncio.gather(*clients)
        return results

    results = asyncio.run(load())
    statuses = {status for status, _ in results}
    stats = httpx.get(f"{stack.sim_url('theta')}/_stats").json()

    assert 500 not in statuses and 0 not in statuses, statuses
    assert not any(b"Script" in body or b"NOSCRIPT" in body for _, body in results)
    assert statuses <= {200, 429, 503}
    assert sum(status == 200 for status, _ in results) > 20, "traffic flows again after relearning"
    # The provider's own limit is the concurrency the broker guards: it was never exceeded,
    # streams from before the restart included (they re-registered when renewing their lease).
    assert stats["peak_concurrency"] <= CONCURRENCY
    assert stats["rate_limited"] == {}


def test_an_outage_is_refused_as_broker_unavailable_and_logged_once_per_kind(restart_stack):
    stack, server = restart_stack
    payload = {"model": "restart/m", "messages": [{"role": "user", "content": "go"}]}
    tracebacks_before = logged_tracebacks(stack.log("gateway"))

    server.kill()
    refusals = []
    try:
        with httpx.Client(timeout=10) as http:
            stop_at = time.monotonic() + 4
            while time.monotonic() < stop_at:
                refusals.append(
                    http.post(
                        f"{stack.base_url}/v1/chat/completions",
                        headers={"Authorization": f"Bearer {KEY}"},
                        json=payload,
                    )
                )
    finally:
        server.start()

    assert len(refusals) > 50
    assert {r.status_code for r in refusals} == {503}
    # The body says what the header says, in the envelope.
    assert {r.headers["x-switchyard-reason"] for r in refusals} == {"broker_unavailable"}
    assert {r.json()["error"]["code"] for r in refusals} == {"broker_unavailable"}
    assert {r.json()["error"]["reason"] for r in refusals} == {"broker_unavailable"}
    # One traceback per kind of failure (request, mailbox, pump, ledger, routing statistics,
    # configuration…) in the interval, not one per request.
    log = stack.log("gateway")
    assert logged_tracebacks(log) - tracebacks_before <= 8, log[-6000:]


def logged_tracebacks(log: str) -> int:
    """Tracebacks logged, a chained exception's counted once."""
    chained = log.count("During handling of the above exception") + log.count(
        "The above exception was the direct cause"
    )
    return log.count("Traceback (most recent call last)") - chained
