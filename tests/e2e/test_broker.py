"""The rate-limit broker end to end (issue 3): real gateway, real simulator, real Redis.

A market of its own: `delta` (60 requests/min, 12 concurrent — enforced by the simulator and
configured identically in the gateway), `epsilon` (a simulator limit of 30 requests/min that the
gateway is NOT told about, so only the provider's own 429s and Retry-After can teach it),
`zeta` (no limits, for faults), `iota` (30 requests/min known to the gateway, for failed
attempts), and three tenants sharing them.
"""

import asyncio
import json
import time

import httpx
import pytest
import yaml

from tests.e2e.brokerstate import bucket_available, learned_available
from tests.stack import Stack, staff_client, wait_until

pytestmark = pytest.mark.e2e

DEADLINE = 3.0
MARKET = {
    "providers": [
        {
            "name": "delta",
            "port": 9201,
            "protocol": "openai",
            "limits": {"requests_per_minute": 60, "concurrency": 12},
            "models": {
                "m": {
                    "ttft_ms": {"median": 40, "p95": 80},
                    "tokens_per_s": {"median": 400, "p05": 200},
                    "error_rate": 0.0,
                    "cache_hit_rate": 1.0,
                }
            },
        },
        {
            "name": "epsilon",
            "port": 9202,
            "protocol": "openai",
            "limits": {"requests_per_minute": 30},
            "models": {
                "m": {
                    "ttft_ms": {"median": 20, "p95": 40},
                    "tokens_per_s": {"median": 1000, "p05": 500},
                    "error_rate": 0.0,
                }
            },
        },
        {
            "name": "eta",
            "port": 9204,
            "protocol": "openai",
            "models": {
                "m": {
                    "ttft_ms": {"median": 10, "p95": 20},
                    "tokens_per_s": {"median": 2000, "p05": 1000},
                    "error_rate": 0.0,
                }
            },
        },
        {
            # Three requests at a time, published nowhere: only its 429s can teach the broker.
            "name": "theta",
            "port": 9205,
            "protocol": "openai",
            "limits": {"concurrency": 3},
            "models": {
                "m": {
                    "ttft_ms": {"median": 300, "p95": 400},
                    "tokens_per_s": {"median": 100, "p05": 80},
                    "error_rate": 0.0,
                }
            },
        },
        {
            "name": "iota",
            "port": 9206,
            "protocol": "openai",
            "models": {
                "m": {
                    "ttft_ms": {"median": 10, "p95": 20},
                    "tokens_per_s": {"median": 2000, "p05": 1000},
                    "error_rate": 0.0,
                }
            },
        },
        {
            # Two requests a minute, the same limit as the gateway's: the third waits 30 s.
            "name": "kappa",
            "port": 9207,
            "protocol": "openai",
            "limits": {"requests_per_minute": 2},
            "models": {
                "m": {
                    "ttft_ms": {"median": 10, "p95": 20},
                    "tokens_per_s": {"median": 2000, "p05": 1000},
                    "error_rate": 0.0,
                }
            },
        },
        {
            # Cheap, and its spend window (the gateway's alone) full after a few requests.
            "name": "lambda",
            "port": 9208,
            "protocol": "openai",
            "models": {
                "m": {
                    "ttft_ms": {"median": 20, "p95": 40},
                    "tokens_per_s": {"median": 1000, "p05": 500},
                    "error_rate": 0.0,
                }
            },
        },
        {
            "name": "zeta",
            "port": 9203,
            "protocol": "openai",
            "models": {
                "m": {
                    "ttft_ms": {"median": 20, "p95": 40},
                    "tokens_per_s": {"median": 1000, "p05": 500},
                    "error_rate": 0.0,
                }
            },
        },
    ]
}


def _endpoint(provider):
    return {
        "provider": provider,
        "upstream_model": "m",
        "price": {"input": 1.0, "cached_input": 0.1, "output": 2.0},
        "context_window": 100000,
        "max_output": 4096,
        "supports": ["tools", "stream"],
    }


def _tenant(name, limits=(), workload="interactive"):
    return {
        "name": name,
        "limits": list(limits),
        "teams": [
            {
                "name": "t",
                "apps": [
                    {
                        "name": "a",
                        "default_workload": workload,
                        "keys": [{"name": "k", "secret": f"sk-sy-test-broker-{name}"}],
                    }
                ],
            }
        ],
    }


CONFIG = {
    "providers": [
        {
            "name": "delta",
            "protocol": "openai",
            "base_url": "http://127.0.0.1:9201/v1",
            "api_key_env": "ALPHA_API_KEY",
            "limits": [
                {"dimension": "requests", "capacity": 60, "per": "1m"},
                {"dimension": "concurrency", "capacity": 12},
            ],
        },
        {
            "name": "epsilon",
            "protocol": "openai",
            "base_url": "http://127.0.0.1:9202/v1",
            "api_key_env": "ALPHA_API_KEY",
            "limits": [{"dimension": "requests", "capacity": 6000, "per": "1m"}],
        },
        {
            "name": "eta",
            "protocol": "openai",
            "base_url": "http://127.0.0.1:9204/v1",
            "api_key_env": "ALPHA_API_KEY",
            # 10 requests/s with a burst of 10, so the test sees the steady rate at once.
            "limits": [{"dimension": "requests", "capacity": 10, "per": "1s"}],
        },
        {
            "name": "theta",
            "protocol": "openai",
            "base_url": "http://127.0.0.1:9205/v1",
            "api_key_env": "ALPHA_API_KEY",
        },
        {
            "name": "iota",
            "protocol": "openai",
            "base_url": "http://127.0.0.1:9206/v1",
            "api_key_env": "ALPHA_API_KEY",
            "limits": [
                {"dimension": "requests", "capacity": 30, "per": "1m"},
                {"dimension": "concurrency", "capacity": 4},
            ],
        },
        {
            "name": "kappa",
            "protocol": "openai",
            "base_url": "http://127.0.0.1:9207/v1",
            "api_key_env": "ALPHA_API_KEY",
            "limits": [{"dimension": "requests", "capacity": 2, "per": "1m"}],
        },
        {
            "name": "lambda",
            "protocol": "openai",
            "base_url": "http://127.0.0.1:9208/v1",
            "api_key_env": "ALPHA_API_KEY",
            "limits": [
                {"dimension": "spend", "capacity": 0.00003, "window": "rolling", "duration": "1h"}
            ],
        },
        {
            "name": "zeta",
            "protocol": "openai",
            "base_url": "http://127.0.0.1:9203/v1",
            "api_key_env": "ALPHA_API_KEY",
        },
    ],
    "models": [
        {
            "slug": "broker/delta",
            "endpoints": [_endpoint("delta")],
            "fallback_model": "broker/zeta",
        },
        {"slug": "broker/epsilon", "endpoints": [_endpoint("epsilon")]},
        {"slug": "broker/eta", "endpoints": [_endpoint("eta")]},
        {"slug": "broker/theta", "endpoints": [_endpoint("theta")]},
        {"slug": "broker/iota", "endpoints": [_endpoint("iota")]},
        {"slug": "broker/kappa", "endpoints": [_endpoint("kappa")]},
        {"slug": "broker/zeta", "endpoints": [_endpoint("zeta")]},
        {
            "slug": "broker/lambda",
            "endpoints": [
                {
                    **_endpoint("lambda"),
                    "price": {"input": 0.1, "cached_input": 0.1, "output": 0.2},
                },
                _endpoint("zeta"),
            ],
        },
    ],
    "workload_classes": [
        {
            "name": "interactive",
            "deadline": f"{int(DEADLINE)}s",
            "max_queue_depth": 1000,
            "overload": "reject",
            "weight": 8,
            "retry_budget": 2,
        },
        {
            "name": "degrading",
            "deadline": f"{int(DEADLINE)}s",
            "max_queue_depth": 1000,
            "overload": "degrade",
            "weight": 8,
        },
    ],
    "tenants": [
        _tenant(
            "one",
            [
                {
                    "dimension": "total_tokens",
                    "capacity": 10000000,
                    "window": "day",
                    "resets_at": "00:00",
                    "timezone": "UTC",
                }
            ],
        ),
        _tenant("two"),
        # A trial limit: one request a minute, in shadow mode — counted, never enforced.
        _tenant("three", [{"dimension": "requests", "capacity": 1, "per": "1m", "shadow": True}]),
        _tenant("four", workload="degrading"),
    ],
}
KEYS = {name: f"sk-sy-test-broker-{name}" for name in ("one", "two", "three")}
DEGRADING_KEY = "sk-sy-test-broker-four"


@pytest.fixture(scope="module")
def broker_stack(tmp_path_factory):
    import os

    folder = tmp_path_factory.mktemp("broker")
    market, config = folder / "market.yaml", folder / "switchyard.yaml"
    market.write_text(yaml.safe_dump(MARKET))
    config.write_text(yaml.safe_dump(CONFIG))
    stack = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        market=market,
        config=config,
        latency_scale=1.0,
        celery=True,
    )
    try:
        yield stack.start()
    finally:
        stack.stop()


def sim_stats(stack, provider):
    return httpx.get(f"{stack.sim_url(provider)}/_stats").json()


async def _post(client, stack, key, payload, headers=None):
    started = time.monotonic()
    response = await client.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", **(headers or {})},
        json=payload,
    )
    return response, time.monotonic() - started


def _payload(model, **extra):
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 16,
        **extra,
    }


def test_it_keeps_a_burst_of_five_times_the_limit_away_from_the_provider(broker_stack):
    """Three tenants send 300 requests at once to a pool of 60 requests/min."""
    before = sim_stats(broker_stack, "delta")

    async def burst():
        limits = httpx.Limits(max_connections=400)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            calls = [
                _post(client, broker_stack, KEYS[tenant], _payload("broker/delta"))
                for _ in range(100)
                for tenant in KEYS
            ]
            return await asyncio.gather(*calls)

    started = time.monotonic()
    results = asyncio.run(burst())
    elapsed = time.monotonic() - started
    after = sim_stats(broker_stack, "delta")

    statuses = [r.status_code for r, _ in results]
    assert set(statuses) <= {200, 429}, statuses
    assert after["rate_limited"] == before["rate_limited"], "the provider answered 429"
    served = statuses.count(200)
    assert served == after["requests"] - before["requests"]
    assert served <= 60 + elapsed * 1.0 + 1  # a full bucket plus what refilled meanwhile
    for response, _ in results:
        waited = int(response.headers["x-switchyard-queue-wait-ms"]) / 1000
        assert waited <= DEADLINE + 0.1, "a waiter stayed past its deadline"
        if response.status_code == 429:
            assert int(response.headers["Retry-After"]) >= 1
            assert response.headers["x-switchyard-reason"]
            assert response.json()["error"]["reason"] == response.headers["x-switchyard-reason"]
            # (The client's own clock also counts the accept backlog of 300 connections
            # arriving at once on one gateway worker; the deadline is the gateway's.)


def test_it_keeps_retries_of_a_half_broken_provider_within_the_budget(broker_stack):
    httpx.post(
        f"{broker_stack.sim_url('zeta')}/_incident",
        json={"model": "m", "for": "15s", "overload_rate": 0.5},
    ).raise_for_status()
    before = sim_stats(broker_stack, "zeta")["requests"]

    async def requests():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(
                *(
                    _post(client, broker_stack, KEYS["two"], _payload("broker/zeta"))
                    for _ in range(20)
                )
            )

    results = asyncio.run(requests())
    attempts = [int(r.headers["x-switchyard-attempts"]) for r, _ in results]
    reached = sim_stats(broker_stack, "zeta")["requests"] - before
    assert max(attempts) <= 3, "interactive work has a budget of two retries"
    assert reached == sum(attempts), "every attempt the gateway counted reached the provider once"
    assert sum(r.status_code == 200 for r, _ in results) >= 15
    wait_until(
        lambda: not sim_stats(broker_stack, "zeta")["incidents"], timeout=20, what="incident end"
    )


def test_it_counts_every_call_a_failing_provider_received_against_its_request_rate(
    broker_stack,
):
    """F4: a 500 still used one of iota's 30 requests a minute; its slot comes back."""
    httpx.post(
        f"{broker_stack.sim_url('iota')}/_incident",
        json={"model": "m", "for": "60s", "overload_rate": 1.0},
    ).raise_for_status()
    before = sim_stats(broker_stack, "iota")["requests"]
    room = bucket_available(broker_stack, "provider:iota:requests:1m")
    started = time.monotonic()

    async def requests():
        async with httpx.AsyncClient(timeout=30) as client:
            return [await _post(client, broker_stack, KEYS["two"], _payload("broker/iota"))]

    results = asyncio.run(requests()) + asyncio.run(requests())
    assert all(r.status_code >= 500 for r, _ in results)
    received = sim_stats(broker_stack, "iota")["requests"] - before
    assert received == sum(int(r.headers["x-switchyard-attempts"]) for r, _ in results) > 2
    used = room - bucket_available(broker_stack, "provider:iota:requests:1m")
    refilled = 0.5 * (time.monotonic() - started)  # 30 a minute
    assert received - refilled - 0.01 <= used <= received + 0.01, (room, used, refilled)
    assert bucket_available(broker_stack, "provider:iota:concurrency") == 4


def test_it_sends_nothing_to_a_provider_before_its_retry_after(broker_stack):
    """epsilon allows 30 requests/min but the gateway believes 6000: only its 429 can tell."""
    stats = f"{broker_stack.sim_url('epsilon')}/_stats"

    async def sequential():
        results = []
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(45):
                results.append(
                    await _post(client, broker_stack, KEYS["three"], _payload("broker/epsilon"))
                )
        return results

    results = asyncio.run(sequential())
    after = httpx.get(stats).json()
    assert after["rate_limited"], "the provider's own limit was reached"
    assert after["requests_ignoring_retry_after"] == 0
    refused = [r for r, _ in results if r.status_code == 429]
    assert all(r.headers.get("Retry-After") for r in refused)
    # H2: operators see how often providers said when to come back.
    client = staff_client(broker_stack)
    try:
        page = client.get("/metrics").text
    finally:
        client.close()
    counted = [
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith('switchyard_provider_retry_after_total{provider="epsilon"}')
    ]
    assert counted and counted[0] >= 1


def test_it_learns_a_concurrency_limit_the_provider_does_not_publish(broker_stack):
    """theta serves three requests at a time; its 429s name no exhausted limit, so the broker
    learns a concurrency limit from them, and the next burst waits for slots instead."""

    async def burst():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(
                *(
                    _post(client, broker_stack, KEYS["two"], _payload("broker/theta"))
                    for _ in range(10)
                )
            )

    def refused_by_theta() -> int:
        return sum(sim_stats(broker_stack, "theta")["rate_limited"].values())

    asyncio.run(burst())
    first = refused_by_theta()
    learned = learned_available(broker_stack, "theta")
    time.sleep(1.5)  # theta's Retry-After (1 s) has passed: the next burst meets no pause
    results = asyncio.run(burst())
    second = refused_by_theta() - first
    print(f"\ntheta 429s: first burst {first}, second {second}; learned room then {learned}")

    assert first >= 5, "ten at once to three slots: the provider refused the excess"
    # Cut to 0.9 × what was in flight, then one more every 5 s: near 3, far below the ceiling.
    assert learned <= 4, "the learned limit follows what theta took"
    assert second <= 2
    assert sum(r.status_code == 200 for r, _ in results) >= 9


def test_it_reconciles_streaming_usage_exactly_including_cached_tokens(broker_stack):
    long_prompt = "Please summarise the following notes carefully. " * 200
    payload = {
        "model": "broker/delta",
        "messages": [{"role": "user", "content": long_prompt}],
        "max_tokens": 400,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    before = bucket_available(broker_stack, "tenant:one:total_tokens:day")
    with httpx.stream(
        "POST",
        f"{broker_stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEYS['one']}"},
        json=payload,
        timeout=30,
    ) as response:
        assert response.status_code == 200
        chunks = [
            json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")
        ]
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0, "the simulator reported a cache hit"
    after = bucket_available(broker_stack, "tenant:one:total_tokens:day")
    assert before - after == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("leaving", ["disconnects", "times_out"])
def test_it_leaves_no_slot_or_tokens_behind_when_a_streaming_client_goes(broker_stack, leaving):
    # Slow tokens: one every ~0.5 s, so the stream is surely running when the client goes.
    httpx.post(
        f"{broker_stack.sim_url('delta')}/_incident",
        json={"model": "m", "for": "3s", "tokens_per_s": {"median": 2, "p05": 1.5}},
    ).raise_for_status()
    tokens_before = bucket_available(broker_stack, "tenant:one:total_tokens:day")
    payload = {
        "model": "broker/delta",
        "messages": [{"role": "user", "content": "a long story"}],
        "max_tokens": 2000,
        "stream": True,
    }
    read_timeout = 0.2 if leaving == "times_out" else 30
    with (
        httpx.Client(timeout=httpx.Timeout(30, read=read_timeout)) as client,
        client.stream(
            "POST",
            f"{broker_stack.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEYS['one']}"},
            json=payload,
        ) as response,
    ):
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert bucket_available(broker_stack, "provider:delta:concurrency") == 11
        if leaving == "times_out":
            with pytest.raises(httpx.ReadTimeout):
                list(lines)
        # leaving the block closes the connection mid-stream
    wait_until(
        lambda: bucket_available(broker_stack, "provider:delta:concurrency") == 12,
        timeout=5,
        what="the concurrency slot to come back",
    )
    spent = tokens_before - bucket_available(broker_stack, "tenant:one:total_tokens:day")
    assert 0 < spent < 2000, "reconciled to what was streamed, not the 2000 reserved"
    wait_until(lambda: not sim_stats(broker_stack, "delta")["incidents"], timeout=5, what="calm")


def test_it_sends_one_request_for_one_idempotency_key(broker_stack):
    before = sim_stats(broker_stack, "zeta")["requests"]

    async def twice():
        async with httpx.AsyncClient(timeout=30) as client:
            headers = {"Idempotency-Key": "order-4711"}
            return await asyncio.gather(
                *(
                    _post(client, broker_stack, KEYS["two"], _payload("broker/zeta"), headers)
                    for _ in range(2)
                )
            )

    results = asyncio.run(twice())
    assert sim_stats(broker_stack, "zeta")["requests"] - before == 1
    served = [
        r for r, _ in results if r.status_code == 200 and "idempotent-replayed" not in r.headers
    ]
    assert len(served) == 1
    # The other meets 409 while the first is in flight, or its replay once it has finished.
    second = next(r for r, _ in results if r is not served[0])
    if second.status_code == 200:
        assert second.headers["idempotent-replayed"] == "true"
    else:
        assert second.json()["error"]["code"] == "idempotency_conflict"


def test_it_counts_but_never_enforces_a_shadow_limit(broker_stack):
    responses = [
        httpx.post(
            f"{broker_stack.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEYS['three']}"},
            json=_payload("broker/zeta"),
            timeout=30,
        )
        for _ in range(3)
    ]
    assert [r.status_code for r in responses] == [200, 200, 200]

    def shadowed():
        ids = [r.json()["id"] for r in responses]
        rows = broker_stack.sql("select detail from gateway_generation where id = any(%s)", ids)
        return [d["shadow_refusals"] for (d,) in rows if d.get("shadow_refusals")]

    wait_until(lambda: len(shadowed()) >= 2, timeout=15, what="shadow refusals in the ledger")
    assert shadowed()[0] == ["tenant:three:requests:1m:shadow:bucket_exhausted"]


async def _open_loop(stack, rates, seconds):
    """Send each tenant's requests at a fixed rate (open loop); (tenant, finished at, status)."""
    results = []
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=500)) as client:

        async def one(tenant):
            response, _ = await _post(client, stack, KEYS[tenant], _payload("broker/eta"))
            results.append((tenant, time.monotonic(), response.status_code))

        tasks = []
        start = time.monotonic()
        sent = dict.fromkeys(rates, 0)
        while (now := time.monotonic()) < start + seconds:
            for tenant, rate in rates.items():
                while sent[tenant] < (now - start) * rate:
                    sent[tenant] += 1
                    tasks.append(asyncio.create_task(one(tenant)))
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
    return start, results


def _throughput(start, results, tenant, window):
    """Served requests per second of one tenant within [start + window[0], start + window[1]]."""
    low, high = start + window[0], start + window[1]
    served = [
        t for who, t, status in results if who == tenant and status == 200 and low <= t < high
    ]
    return len(served) / (high - low)


def test_it_holds_a_noisy_tenant_to_its_share_of_the_pool(broker_stack):
    """Pool: 10 requests/s for three equal tenants. B and C send 2.5/s, within their share;
    A floods at 33/s, ten times its share of 3.3/s."""
    steady = {"two": 2.5, "three": 2.5}
    window = (3.0, 15.0)  # once the queue is in its steady state
    start, alone = asyncio.run(_open_loop(broker_stack, steady, 15.0))
    quiet = {t: _throughput(start, alone, t, window) for t in steady}
    start, crowded = asyncio.run(_open_loop(broker_stack, {"one": 33.0, **steady}, 15.0))
    noisy = {t: _throughput(start, crowded, t, window) for t in ("one", *steady)}

    for tenant in steady:
        assert noisy[tenant] >= 0.9 * quiet[tenant], (tenant, quiet, noisy)
    # Max-min fair shares of the 10/s: B and C get what they ask, A the rest. Jain's index
    # over each tenant's throughput divided by its fair share.
    shares = {"two": 2.5, "three": 2.5, "one": 10.0 - 5.0}
    ratios = [noisy[t] / shares[t] for t in shares]
    jain = sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios))
    assert jain >= 0.95, (noisy, jain)
    refused = [status for who, _, status in crowded if who == "one" and status != 200]
    assert refused and set(refused) == {429}, "the flood is refused, not failed"


def test_it_degrades_to_the_fallback_model_instead_of_refusing(broker_stack):
    """delta (60/min) is served first; what it has no room for goes to its fallback, at once."""

    async def crowd():
        async with httpx.AsyncClient(
            timeout=30, limits=httpx.Limits(max_connections=200)
        ) as client:
            return await asyncio.gather(
                *(
                    _post(client, broker_stack, DEGRADING_KEY, _payload("broker/delta"))
                    for _ in range(90)
                )
            )

    results = asyncio.run(crowd())
    assert [r.status_code for r, _ in results] == [200] * 90
    degraded = [
        r for r, _ in results if r.headers.get("x-switchyard-degraded-from") == "broker/delta"
    ]
    assert degraded, "delta's 60/min cannot take 90 at once"
    assert all(r.json()["model"] == "broker/zeta" for r in degraded)
    assert all(r.headers["x-switchyard-provider"] == "zeta" for r in degraded)
    assert all(seconds < DEADLINE for _, seconds in results), "degrading does not wait first"


def test_it_refuses_at_once_whom_its_own_line_keeps_past_the_deadline(broker_stack):
    """E6: eta refills ten requests a second (and its provider sets no limit of its own). A
    tenant's line of eighty cannot all fit before the 3 s deadline: those that cannot are
    told so at once, not at the deadline."""

    async def burst():
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100)) as c:
            calls = [_post(c, broker_stack, KEYS["two"], _payload("broker/eta")) for _ in range(80)]
            return await asyncio.gather(*calls)

    results = asyncio.run(burst())

    served = [r for r, _ in results if r.status_code == 200]
    refused = [r for r, _ in results if r.status_code == 429]
    assert len(served) >= 10 and len(served) + len(refused) == 80
    at_once = [r for r in refused if int(r.headers["x-switchyard-queue-wait-ms"]) < 500]
    assert len(at_once) >= 20, (len(at_once), len(refused))
    assert {r.headers["x-switchyard-reason"] for r in at_once} == {"deadline_unreachable"}
    message = at_once[0].json()["error"]["message"]
    assert "will not have room for it before its deadline" in message
    assert all(int(r.headers["Retry-After"]) >= 1 for r in at_once)
    # No provider saw them: a client may retry after Retry-After.
    assert {r.headers["x-should-retry"] for r in at_once} == {"true"}


def test_it_refuses_before_any_broker_call_when_every_candidate_is_full_past_the_deadline(
    broker_stack,
):
    """Issue 17 item 3: kappa takes two requests a minute. The third is refused by the broker
    (its next fit is 30 s away, past the 3 s deadline), and the router hears when kappa fits
    again from that answer; the fourth is refused by the plan itself, on those grounds, naming
    the endpoint and when it has room, without a broker call or a provider call."""
    before = sim_stats(broker_stack, "kappa")

    async def one_after_another():
        async with httpx.AsyncClient(timeout=30) as client:
            return [
                await _post(client, broker_stack, KEYS["two"], _payload("broker/kappa"))
                for _ in range(4)
            ]

    results = asyncio.run(one_after_another())

    statuses = [r.status_code for r, _ in results]
    assert statuses == [200, 200, 429, 429], statuses
    third, fourth = results[2][0], results[3][0]
    assert third.headers["x-switchyard-reason"] == "deadline_unreachable"
    assert fourth.headers["x-switchyard-reason"] == "capacity_wait"
    message = fourth.json()["error"]["message"]
    assert "every endpoint that can serve it is full past its deadline" in message
    assert "'broker/kappa@kappa'" in message
    assert 20 <= int(fourth.headers["Retry-After"]) <= 31
    assert fourth.headers["x-should-retry"] == "true"
    assert sim_stats(broker_stack, "kappa")["requests"] - before["requests"] == 2


def test_it_keeps_a_request_that_would_displace_several_out_of_a_scarce_pool(broker_stack):
    """Issue 17, shadow prices: lambda is ten times cheaper than zeta, and its spend window
    holds a handful of short answers. Once it is full, the broker refuses every try there and
    the gateway's router hears it (which bucket, for a request of what size): a short request
    still has lambda in its plan, while one whose prompt would take several short answers'
    spend is planned without it ("scarce")."""

    async def short_ones(n):
        async with httpx.AsyncClient(timeout=30) as client:
            return [
                await _post(client, broker_stack, KEYS["two"], _payload("broker/lambda"))
                for _ in range(n)
            ]

    results = asyncio.run(short_ones(40))
    assert all(r.status_code == 200 for r, _ in results)
    providers = [r.headers["x-switchyard-provider"] for r, _ in results]
    assert "lambda" in providers[:5], providers  # its window takes the first few
    assert providers[-10:].count("zeta") >= 9, providers  # then zeta serves them

    short, _ = asyncio.run(short_ones(1))[0]
    assert short.status_code == 200
    route = short.headers["x-switchyard-route"]
    assert "scarce" not in route and "=lambda" in route, route  # winner or runner-up

    long_prompt = " ".join(["hello"] * 150)

    async def long_one():
        async with httpx.AsyncClient(timeout=30) as client:
            payload = _payload("broker/lambda")
            payload["messages"] = [{"role": "user", "content": long_prompt}]
            return await _post(client, broker_stack, KEYS["two"], payload)

    long, _ = asyncio.run(long_one())
    assert long.status_code == 200
    assert long.headers["x-switchyard-provider"] == "zeta"
    route = long.headers["x-switchyard-route"]
    assert "broker/lambda@lambda:scarce" in route, route
