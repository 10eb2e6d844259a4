"""An endpoint behind an open breaker is not retried on itself (G7, F2): when a caller leaves
it as the only way (``provider.only``), each request makes one attempt, not the whole budget."""

import os
import time

import httpx
import pytest

from tests.stack import Stack

pytestmark = pytest.mark.e2e

KEY = "sk-sy-test-acme-web-0001"


@pytest.fixture(scope="module")
def stack():
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        latency_scale=0.05,
        celery=False,
    )
    try:
        yield running.start()
    finally:
        running.stop()


def ask(stack: Stack, provider: str = "alpha") -> httpx.Response:
    return httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "model": "acme/chat-large",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 20,
            "provider": {"only": [provider]},
        },
        timeout=30,
    )


def test_it_tries_an_endpoint_behind_an_open_breaker_once(stack):
    # Its peers' health is known: the breaker opens on faults far above theirs.
    assert {ask(stack, peer).status_code for peer in ("beta", "gamma") for _ in range(6)} == {200}
    overloaded = httpx.post(
        f"{stack.sim_url('alpha')}/_incident",
        json={"model": "chat-large", "for": "60s", "overload_rate": 1.0},
    )
    assert overloaded.status_code == 200, overloaded.text

    before = [ask(stack) for _ in range(8)]  # alpha's faults open its breaker…
    time.sleep(2.5)  # …once the router's table is refreshed (refresh_interval_s, sync interval)
    after = [ask(stack) for _ in range(8)]

    assert {r.status_code for r in before + after} == {503}
    assert int(before[0].headers["x-switchyard-attempts"]) == 3  # the budget, while closed
    assert "alpha:breaker" in after[-1].headers["x-switchyard-route"]
    assert [r.headers["x-switchyard-attempts"] for r in after] == ["1"] * 8
    assert after[-1].headers["x-switchyard-reason"].endswith(":breaker_open")
    assert after[-1].headers["x-should-retry"] == "false"
