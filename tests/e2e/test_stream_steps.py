"""Streams that reserve their output in steps (SPEC C10's second approach; issue 18 item 5).

A real gateway, Redis, PostgreSQL, a Celery worker (the ledger) and the provider simulator
streaming over HTTP to the official ``openai`` SDK. The simulator's model always answers
``ANSWER_TOKENS`` tokens at ``TOKENS_PER_S``, well under the request's ``max_tokens``, so a
stream runs for a few seconds and the bucket levels can be read from Redis while it runs.

- ``stepped`` (``stream_reservation: increments``, steps of ``STEP``): the stream reserves one
  step at admission and tops up as tokens arrive; it ends holding exactly its real usage. The
  provider's output bucket, which counts ``max_tokens`` as OpenAI does, holds the maximum.
- ``tight``: an app whose output bucket holds less than the answer: a step is refused, the
  answer still completes and its real usage is settled (the bucket goes into debt).
- A client that leaves mid-stream: its partial usage is settled, and nothing is held after.
- ``whole`` (the default, ``max``): the stream holds its whole ``max_tokens`` while it runs.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import httpx
import openai
import pytest
import redis
import yaml

from tests.e2e.brokerstate import bucket_available
from tests.stack import SCRAPE_TOKEN, Stack, wait_until

pytestmark = pytest.mark.e2e

STEP = 16
ANSWER_TOKENS = 80
TOKENS_PER_S = 25.0  # the answer takes ~3 s
MAX_TOKENS = 400
CAPACITY = 100_000  # the stepped and whole apps' daily output tokens: never binding
TIGHT = 40  # the tight app's daily output tokens: less than the answer
KEYS = {
    "stepped": "sk-sy-test-steps-stepped-01",
    "whole": "sk-sy-test-steps-whole-0001",
    "tight": "sk-sy-test-steps-tight-0001",
}
MODEL = "steps/chat"


def market(directory: Path) -> Path:
    spec = {
        "ttft_ms": {"median": 50, "p95": 50},
        "tokens_per_s": {"median": TOKENS_PER_S, "p05": TOKENS_PER_S},
        "output_tokens": {"median": ANSWER_TOKENS, "p95": ANSWER_TOKENS},
    }
    data = {
        "providers": [
            {"name": "stepsim", "port": 0, "protocol": "openai", "models": {"chat": spec}}
        ]
    }
    path = directory / "steps-market.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def config(directory: Path) -> Path:
    def app(name: str, workload: str, capacity: int) -> dict:
        return {
            "name": name,
            "default_workload": workload,
            "limits": [{"dimension": "output_tokens", "capacity": capacity, "window": "day"}],
            "keys": [{"name": "ci", "secret": KEYS[name]}],
        }

    workload = {"deadline": "5s", "max_queue_depth": 50, "overload": "reject"}
    data = {
        "providers": [
            {
                "name": "stepsim",
                "protocol": "openai",
                "base_url": "http://127.0.0.1:1/v1",
                "api_key_env": "STEPSIM_API_KEY",
                "learn_concurrency": False,
                # OpenAI counts max_tokens in its output limit when it accepts a call.
                "limits": [{"dimension": "output_tokens", "capacity": CAPACITY, "window": "day"}],
            }
        ],
        "models": [
            {
                "slug": MODEL,
                "endpoints": [
                    {
                        "provider": "stepsim",
                        "upstream_model": "chat",
                        "price": {"input": 0.1, "output": 0.2},
                        "context_window": 32768,
                        "max_output": 4096,
                    }
                ],
            }
        ],
        "workload_classes": [
            {
                "name": "stepped",
                **workload,
                "stream_reservation": "increments",
                "stream_step_tokens": STEP,
            },
            {"name": "whole", **workload},
        ],
        "tenants": [
            {
                "name": "steps",
                "teams": [
                    {
                        "name": "t",
                        "apps": [
                            app("stepped", "stepped", CAPACITY),
                            app("whole", "whole", CAPACITY),
                            app("tight", "stepped", TIGHT),
                        ],
                    }
                ],
            }
        ],
    }
    path = directory / "steps.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    directory = tmp_path_factory.mktemp("steps")
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        market=market(directory),
        config=config(directory),
        celery=True,
        # The levels read here are the streams' own reservations: an allowance taken while
        # one runs (a class that reserves the maximum may use them) would be counted in them.
        extra_env={"STEPSIM_API_KEY": "sim-stepsim", "BROKER_ALLOWANCE_REQUESTS": "0"},
    )
    try:
        yield running.start()
    finally:
        running.stop()


def client(stack: Stack, app: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{stack.base_url}/v1", api_key=KEYS[app], max_retries=0, timeout=30
    )


def bucket(app: str) -> str:
    return f"app:steps/t/{app}:output_tokens:day"


def held(stack: Stack, app: str, capacity: int = CAPACITY) -> float:
    """Output tokens the app's bucket counts as taken (reserved or used) right now."""
    return capacity - bucket_available(stack, bucket(app))


def provider_held(stack: Stack) -> float:
    """Output tokens the provider's daily bucket counts as taken right now."""
    [(name,)] = stack.sql(
        "select name from quotas_bucket where scope_kind = %s and dimension = %s",
        "provider",
        "output_tokens",
    )
    return CAPACITY - bucket_available(stack, name)


def stream(stack: Stack, app: str):
    return client(stack, app).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "tell me about flows"}],
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )


def steps_counted(stack: Stack) -> dict[str, float]:
    page = httpx.get(
        f"{stack.base_url}/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"}
    ).text
    counted: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith("switchyard_stream_steps_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            counted[outcome] = float(line.rsplit(" ", 1)[1])
    return counted


def test_a_stream_in_steps_reserves_one_step_tops_up_as_tokens_arrive_and_ends_at_its_usage(
    stack,
):
    before, provider_before = held(stack, "stepped"), provider_held(stack)
    raw = stream(stack, "stepped")
    assert raw.headers["x-switchyard-stream-reservation"] == "increments"
    assert raw.headers["x-switchyard-reserved-output-tokens"] == str(STEP)
    levels, provider_levels, text, usage = [], set(), [], None
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
            if len(levels) < 40:  # while tokens still come (the settle follows the last)
                levels.append(held(stack, "stepped") - before)
                provider_levels.add(provider_held(stack) - provider_before)
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens == ANSWER_TOKENS
    print(f"\noutput held while streaming: {levels}")
    # While it ran the stream held one step at first (a second may be on its way by the first
    # read), then more as tokens came, and never anything near its max_tokens (what
    # reserve-max holds from the start).
    assert STEP <= levels[0] <= 2 * STEP
    assert max(levels) > 2 * STEP, "the stream took no steps while it ran"
    assert all(a <= b for a, b in itertools.pairwise(levels)), "held fell mid-stream"
    assert max(levels) < MAX_TOKENS // 2
    # The provider counts max_tokens from the start: its bucket held the maximum throughout.
    assert provider_levels == {MAX_TOKENS}
    # At the end the bucket holds exactly the real usage: first step + steps reconciled.
    wait_until(lambda: not leased(stack), timeout=5, what="the stream's lease to be settled")
    assert held(stack, "stepped") - before == usage.completion_tokens
    assert provider_held(stack) - provider_before == usage.completion_tokens
    assert "".join(text)
    assert steps_counted(stack).get("granted", 0) >= 1


def test_a_refused_step_does_not_cut_the_answer_and_its_usage_is_settled(stack):
    refused_before = steps_counted(stack).get("refused", 0)
    raw = stream(stack, "tight")
    assert raw.headers["x-switchyard-stream-reservation"] == "increments"
    finish, usage, pieces = None, None, 0
    for chunk in raw.parse():
        if chunk.choices:
            pieces += bool(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    # The whole answer came: the provider's own end, and every token of it.
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == ANSWER_TOKENS > TIGHT
    wait_until(lambda: not leased(stack), timeout=5, what="the stream's lease to be settled")
    # Real usage settled beyond what the bucket holds: it is in debt by the difference.
    assert held(stack, "tight", TIGHT) == ANSWER_TOKENS
    assert steps_counted(stack).get("refused", 0) == refused_before + 1  # then no more asked
    # The next stream of the app finds no room for even its first step.
    with pytest.raises(openai.RateLimitError):
        stream(stack, "tight")


def test_a_client_that_leaves_mid_stream_in_steps_settles_its_partial_usage_and_holds_nothing(
    stack,
):
    before = held(stack, "stepped")
    with (
        httpx.Client(timeout=30) as http,
        http.stream(
            "POST",
            f"{stack.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEYS['stepped']}"},
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "tell me about flows"}],
                "max_tokens": MAX_TOKENS,
                "stream": True,
            },
        ) as response,
    ):
        generation = response.headers["x-request-id"]
        lines = response.iter_lines()
        # Read until the stream has taken a step or two, then leave.
        deadline = time.monotonic() + 10
        while held(stack, "stepped") - before <= STEP and time.monotonic() < deadline:
            next(lines)
        assert held(stack, "stepped") - before > STEP
    # Settled at once: a reconciled reservation, no lease, a 499 in the ledger.
    wait_until(
        lambda: (
            stack.sql("select 1 from quotas_reservation where request_id = %s", generation)
            and stack.sql("select 1 from gateway_generation where id = %s", generation)
        ),
        timeout=10,
        what="the ledger rows",
    )
    [(status, output_tokens)] = stack.sql(
        "select status, output_tokens from gateway_generation where id = %s", generation
    )
    assert status == 499
    assert 0 < output_tokens < ANSWER_TOKENS
    assert not leased(stack, generation)
    settled = held(stack, "stepped") - before
    # The bucket holds what was settled — the partial usage — and no step lands later.
    assert settled == output_tokens
    time.sleep(1.0)
    assert held(stack, "stepped") - before == output_tokens
    [(taken,)] = stack.sql("select taken from quotas_reservation where request_id = %s", generation)
    assert taken[bucket("stepped")] > STEP  # the ledger row has the steps in it


def test_a_stream_of_a_class_that_reserves_the_maximum_holds_it_while_it_runs(stack):
    before = held(stack, "whole")
    raw = stream(stack, "whole")
    assert raw.headers["x-switchyard-stream-reservation"] == "max"
    assert raw.headers["x-switchyard-reserved-output-tokens"] == str(MAX_TOKENS)
    levels, usage = [], None
    for chunk in raw.parse():
        if chunk.usage is not None:
            usage = chunk.usage
        if len(levels) < 5:
            levels.append(held(stack, "whole") - before)
    assert set(levels) == {MAX_TOKENS}
    wait_until(lambda: not leased(stack), timeout=5, what="the stream's lease to be settled")
    assert usage is not None
    assert held(stack, "whole") - before == usage.completion_tokens == ANSWER_TOKENS


def leased(stack: Stack, generation: str = "") -> list[bytes]:
    client = redis.Redis.from_url(stack.redis_url)
    try:
        members = client.zrange(f"{stack.name}:leases", 0, -1)
        return [m for m in members if generation.encode() in m]
    finally:
        client.close()
