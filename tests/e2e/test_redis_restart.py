"""Redis restarted empty under load (issues 3, 14): no request fails with a script error;
while the broker relearns, admissions stay within capacity counting requests still in flight;
the conservative period ends within seconds while the gateway processes live, and a stack
started on a new Redis (no command run first) serves a concurrency-limited provider at once.

Each stack gets a Redis server of its own, killed and started again empty mid-test.
"""

import asyncio
import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
import redis.asyncio
import yaml

from gateway.ledger import CARRIED, record_decode
from tests.stack import SCRAPE_TOKEN, RedisServer, Stack, wait_until

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


def stack_on(server: RedisServer, tmp_path: Path, **options: Any) -> Stack:
    """A stack on its own Redis, started as a deployment is (no command to declare Redis new)."""
    (tmp_path / "market.yaml").write_text(yaml.safe_dump(MARKET))
    (tmp_path / "switchyard.yaml").write_text(yaml.safe_dump(CONFIG))
    return Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=server.url,
        market=tmp_path / "market.yaml",
        config=tmp_path / "switchyard.yaml",
        celery=False,
        **options,
    )


@pytest.fixture
def redis_server(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def restart_stack(tmp_path, redis_server):
    # Short leases, so that a learning period ended by nothing but time fits in the test.
    stack = stack_on(redis_server, tmp_path, extra_env={"RESERVATION_LEASE_SECONDS": "3"})
    try:
        yield stack.start(), redis_server
    finally:
        stack.stop()


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
        # A request still open 5 s after the load ends has hung (each has a 2 s deadline and
        # streams for about 2 s): the gateway then writes its tasks' await chains to its log.
        done, _ = await asyncio.wait(clients, timeout=stop_at + 5 - time.monotonic())
        if len(done) < len(clients):
            os.kill(stack.processes["gateway"].pid, signal.SIGUSR1)
        await asyncio.gather(*clients)
        return results

    results = asyncio.run(load())
    statuses = {status for status, _ in results}
    stats = httpx.get(f"{stack.sim_url('theta')}/_stats").json()

    hung = [b for s, b in results if s in (0, 500)][:3]
    dump = stack.log("gateway").rpartition("(SIGUSR1) ---")[2]
    assert 500 not in statuses and 0 not in statuses, (hung, dump[-6000:])
    assert not any(b"Script" in body or b"NOSCRIPT" in body for _, body in results)
    assert statuses <= {200, 429, 503}
    assert sum(status == 200 for status, _ in results) > 20, "traffic flows again after relearning"
    # The provider's own limit is the concurrency the broker guards: it was never exceeded,
    # streams from before the restart included (they re-registered when renewing their lease).
    assert stats["peak_concurrency"] <= CONCURRENCY
    assert stats["rate_limited"] == {}


def test_an_empty_restart_loses_no_ledger_record_of_the_answers_before_it(restart_stack):
    """Records in Redis are not yet stored (no Celery here: they stay queued), so the gateway
    keeps what it appended, and what each settle carried, for LEDGER_RETAIN_SECONDS: once it
    sees Redis born anew (it looks every second while it keeps any), it appends them again,
    each reservation record with the settlement its settle gave it."""
    stack, server = restart_stack
    payload = {"model": "restart/m", "messages": [{"role": "user", "content": "go"}]}
    answered = []
    with httpx.Client(base_url=stack.base_url, timeout=10) as http:
        for _ in range(12):
            response = http.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {KEY}"},
                json={**payload, "max_tokens": 20},
            )
            assert response.status_code == 200, response.text
            answered.append(response.headers["x-request-id"])
    ledger = f"{stack.name}:ledger"
    before = redis.Redis.from_url(stack.redis_url).lrange(ledger, 0, -1)
    assert sum(item[:1] == CARRIED for item in before) == len(answered)  # carried by settles

    server.kill()
    server.start()  # empty
    client = redis.Redis.from_url(stack.redis_url)
    wait_until(lambda: client.llen(ledger) >= len(before), timeout=15, what="records again")
    records = [record_decode(item) for item in client.lrange(ledger, 0, -1)]
    client.close()

    generations = {r["id"] for r in records if r["kind"] == "generation"}
    reservations = {r["request_id"]: r for r in records if r["kind"] == "reservation"}
    assert set(answered) <= generations
    assert set(answered) <= set(reservations)
    for request_id in answered:
        assert reservations[request_id]["outcome"] == "reconciled"
        assert reservations[request_id]["settled"]  # the settle's, every bucket's figures


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


# The conservative period after a restart may last this long while the gateway processes live
# (issue 14's acceptance); without their reports it would last a lease (30 s).
RECOVERY_BOUND_SECONDS = 5.0


@pytest.fixture
def healing_stack(tmp_path, redis_server):
    """Two gateway processes, the default 30 s lease: only the processes' reports can end a
    learning period early."""
    stack = stack_on(redis_server, tmp_path, gateway_workers=2)
    try:
        yield stack.start(), redis_server
    finally:
        stack.stop()


def test_a_stack_started_without_a_bootstrap_serves_a_concurrency_limited_provider_at_once(
    healing_stack,
):
    stack, _ = healing_stack
    payload = {
        "model": "restart/m",
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 20,
    }
    with httpx.Client(base_url=stack.base_url, timeout=10) as http:
        first = http.post(
            "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, json=payload
        )
    assert first.status_code == 200, first.text
    client = redis.Redis.from_url(stack.redis_url)
    born, until = (float(v) for v in client.hmget(f"{stack.name}:epoch", "born", "until"))
    seconds, micros = client.time()
    client.close()
    assert until <= seconds + micros / 1e6  # no learning period on a new Redis
    assert born == 0.0  # nothing ran before it: refill buckets start full
    assert "broker state new" in stack.log("gateway")


def test_after_an_empty_restart_the_conservative_period_ends_within_seconds(healing_stack):
    stack, server = healing_stack
    payload = {
        "model": "restart/m",
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 80,
        "stream": True,
    }

    async def client(http, results, stop_at):
        while time.monotonic() < stop_at:
            try:
                async with http.stream(
                    "POST",
                    "/v1/chat/completions",
                    headers={"Authorization": f"Bearer {KEY}"},
                    json=payload,
                ) as response:
                    body = await response.aread()
                    results.append((response.status_code, body, dict(response.headers)))
            except httpx.HTTPError as exc:
                results.append((0, repr(exc).encode(), {}))
            if results[-1][0] != 200:
                await asyncio.sleep(0.05)

    async def learning_ends(restarted):
        """When the restarted Redis's epoch stops learning (seconds after ``restarted``)."""
        watcher = redis.asyncio.Redis.from_url(stack.redis_url)
        try:
            while time.monotonic() - restarted < 40:
                until = await watcher.hget(f"{stack.name}:epoch", "until")
                seconds, micros = await watcher.time()
                if until is not None and float(until) <= seconds + micros / 1e6:
                    return time.monotonic() - restarted
                await asyncio.sleep(0.02)
            return None
        finally:
            await watcher.aclose()

    async def load():
        results = []
        stop_at = time.monotonic() + 14
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as http:
            clients = [asyncio.create_task(client(http, results, stop_at)) for _ in range(10)]
            await asyncio.sleep(3)  # streams in flight, holding every slot
            await asyncio.to_thread(server.kill)
            await asyncio.to_thread(server.start)  # empty: no data, no scripts, no epoch
            period = await learning_ends(time.monotonic())
            await asyncio.gather(*clients)
        return results, period

    results, period = asyncio.run(load())
    stats = httpx.get(f"{stack.sim_url('theta')}/_stats").json()
    recovering = [
        (json.loads(body)["error"], headers)
        for status, body, headers in results
        if status == 429 and b'"recovering"' in body
    ]
    report = os.environ.get("RECOVERY_REPORT")
    if report:  # bench/recovery.py collects the figures
        Path(report).write_text(
            json.dumps(
                {
                    "conservative_period_s": period,
                    "requests": len(results),
                    "served": sum(status == 200 for status, _, _ in results),
                    "not_served": {
                        str(code): sum(status == code for status, _, _ in results)
                        for code in sorted({status for status, _, _ in results} - {200})
                    },
                    "refused_recovering": len(recovering),
                    "retry_after_s": sorted({int(h["retry-after"]) for _, h in recovering}),
                    "peak_concurrency": stats["peak_concurrency"],
                    "capacity": CONCURRENCY,
                    "provider_429": sum(stats["rate_limited"].values()),
                }
            )
        )

    assert period is not None and period <= RECOVERY_BOUND_SECONDS, period
    # Streams from before the restart were re-registered by their processes, none renewed
    # within its 30 s lease: the provider never saw more than its limit.
    assert stats["peak_concurrency"] <= CONCURRENCY
    assert stats["rate_limited"] == {}
    statuses = {status for status, _, _ in results}
    assert statuses <= {200, 429, 503}, statuses
    assert sum(status == 200 for status, _, _ in results) > 20
    # While it relearnt, refusals said so, and when to come back: within the bound.
    for error, headers in recovering:
        assert error["reason"] == "recovering" and headers["x-switchyard-reason"] == "recovering"
        assert 1 <= int(headers["retry-after"]) <= RECOVERY_BOUND_SECONDS
    log = stack.log("gateway")
    assert "re-registered" in log and "broker state lost: learning period ended" in log


def test_while_a_live_process_has_not_reported_refusals_say_recovering_and_when(healing_stack):
    """A process that is alive (its row heartbeats) but has not re-registered its reservations
    holds the conservative period; meanwhile the caller, the log and the metrics say why."""
    stack, server = healing_stack
    payload = {
        "model": "restart/m",
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 5,
    }
    elsewhere = "gateway:elsewhere:1:test"
    now = redis_now(stack)
    execute(
        stack,
        "insert into quotas_brokermember (id, started, last_seen) values (%s, %s, %s)",
        elsewhere,
        now - 60,
        now,
    )
    beating = threading.Event()

    def heartbeat():  # the other process lives on, and never looks at Redis
        while not beating.wait(0.5):
            execute(
                stack,
                "update quotas_brokermember set last_seen = %s where id = %s",
                time.time(),
                elsewhere,
            )

    threading.Thread(target=heartbeat, daemon=True).start()
    try:
        server.kill()
        server.start()
        with httpx.Client(base_url=stack.base_url, timeout=10) as http:

            def ask():
                return http.post(
                    "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, json=payload
                )

            deadline = time.monotonic() + 10
            refused = ask()
            while refused.status_code == 503 and time.monotonic() < deadline:
                refused = ask()  # the gateway's connections to the old Redis come back
            assert refused.status_code == 429, refused.text
            error = refused.json()["error"]
            assert error["reason"] == "recovering" == refused.headers["x-switchyard-reason"]
            assert "re-registering" in error["message"]
            # The expected end — a live process reports within seconds — not the 30 s lease.
            assert 1 <= int(refused.headers["retry-after"]) <= 3

            # The gauge is set by the look the refusal pokes, in its own task, which may come
            # after the answer (failed once in CI under load): within a few looks, not at once.
            def scraped():
                return http.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})

            wait_until(
                lambda: "switchyard_broker_recovering 1.0" in scraped().text,
                timeout=5,
                what="switchyard_broker_recovering at 1",
            )
            # (The gateway's other worker may not have reported yet either at that moment.)
            waiting = rf"waiting for \d live processes to report \([^)]*{elsewhere}"
            # The line is logged once per 10 s per process (common/faultlog.py): an earlier
            # test's recovery may have had it said without this process (failed once in CI).
            wait_until(
                lambda: ask().status_code == 429 and re.search(waiting, stack.log("gateway")),
                timeout=15,
                what="the log naming the process awaited",
            )
            assert "refusing requests with reason 'recovering'" in stack.log("gateway")

            execute(stack, "delete from quotas_brokermember where id = %s", elsewhere)  # it stopped
            beating.set()
            wait_until(lambda: ask().status_code == 200, timeout=5, what="the recovery's end")
    finally:
        beating.set()


def redis_now(stack) -> float:
    client = redis.Redis.from_url(stack.redis_url)
    try:
        seconds, micros = client.time()
        return seconds + micros / 1e6
    finally:
        client.close()


def execute(stack, statement: str, *params: object) -> None:
    with psycopg.connect(stack.stack_database_url, autocommit=True) as conn:
        conn.execute(statement, params)
