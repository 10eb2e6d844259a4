"""The simulated gateway path: broker before dispatch, waits, pauses, fallbacks, stickiness."""

from __future__ import annotations

import random

import pytest
import yaml

from configfile import config_parse
from quotas.store.memory import MemoryReservationStore
from routing.core import Router
from simulator.model import parse_market_text
from simulator.switchback.admission import LEASE_S
from simulator.switchback.gateway import SimGateway
from simulator.switchback.loop import EventLoop
from simulator.switchback.market import market_build
from simulator.switchback.metrics import Recorder
from simulator.switchback.traffic import Conversation, SimRequest

CONFIG = """
providers:
  - name: a
    protocol: openai
    base_url: http://127.0.0.1:1/v1
    limits:
      - {dimension: requests, capacity: 2, per: 1m}
  - name: b
    protocol: openai
    base_url: http://127.0.0.1:2/v1
models:
  - slug: t/m
    endpoints:
      - {provider: a, upstream_model: m, price: {input: 0.10, cached_input: 0.01, output: 0.20}, context_window: 100000, max_output: 4096}
      - {provider: b, upstream_model: m, price: {input: 1.00, cached_input: 1.00, output: 2.00}, context_window: 100000, max_output: 4096}
workload_classes:
  - {name: interactive, deadline: 10s, max_queue_depth: 100, overload: reject, weight: 8, retry_budget: 2}
"""
MARKET = """
providers:
  - name: a
    port: 0
    protocol: openai
    limits: {requests_per_minute: 1000}
    models:
      m: {ttft_ms: {median: 300, p95: 300}, tokens_per_s: {median: 100, p05: 100}, cache_hit_rate: 1.0}
  - name: b
    port: 0
    protocol: openai
    limits: {requests_per_minute: 1000, concurrency: 1}
    models:
      m: {ttft_ms: {median: 500, p95: 500}, tokens_per_s: {median: 50, p05: 50}}
traffic:
  duration: 1d
  models:
    t/m: {requests_per_minute: {mean: 1}, input_tokens: {median: 2000, p95: 2000}, output_tokens: {median: 100, p95: 100}}
"""


class Harness:
    def __init__(
        self,
        config: str = CONFIG,
        market: str = MARKET,
        strategy: str = "price_only",
        learn_concurrency: bool = True,
    ):
        self.loop = EventLoop(1000.0)
        sim = market_build(
            config_parse(yaml.safe_load(config)),
            parse_market_text(market),
            scale=1.0,
            rng=random.Random(1),
            origin=1000.0,
            headroom_s=0.0,  # exact bucket sizes keep these scenarios easy to follow
            learn_concurrency=learn_concurrency,
        )
        self.router = Router(sim.models, default_strategy=strategy)
        self.store = MemoryReservationStore(clock=lambda: self.loop.now, lease_seconds=LEASE_S)
        self.recorder = Recorder(
            routes=sim.route_names, endpoints=sim.endpoint_ids, slots=1, origin=1000.0, bin_s=60.0
        )
        self.behaviours = sim.behaviours
        self.follow_ups: list[tuple[SimRequest, bool]] = []
        self.gateway = SimGateway(
            loop=self.loop,
            router=self.router,
            store=self.store,
            routes=sim.routes,
            workload=sim.workload,
            recorder=self.recorder,
            rng=random.Random(2),
            classify=lambda request: 0,
            follow_up=lambda request, tool: self.follow_ups.append((request, tool)),
        )

    def send(self, at: float, **fields) -> SimRequest:
        fields.setdefault("input_tokens", 2000)
        fields.setdefault("output_tokens", 100)
        fields.setdefault("max_tokens", 1024)
        request = SimRequest(model="t/m", arrival=at, **fields)
        self.loop.schedule(at, self.gateway.arrive, request)
        return request

    @property
    def stats(self):
        return self.recorder.slots[0]


def test_it_serves_a_request_and_measures_it_end_to_end():
    h = Harness(strategy="price")  # a: TTFT 0.3 s, 100 tokens/s, every long prompt cached
    request = h.send(1000.0, input_tokens=1000)  # under 1024 tokens: never cached
    h.loop.run(1100.0)
    s = h.stats
    assert (s.requests, s.served, s.broker_refusals, s.provider_429, request.attempts) == (
        1,
        1,
        0,
        0,
        1,
    )
    assert s.ttft_sum == pytest.approx(0.3)
    assert s.throughput_sum == pytest.approx(100 / 1.3)
    assert s.cost_sum == pytest.approx((1000 * 0.10 + 100 * 0.20) / 1e6)
    assert h.follow_ups == [(request, False)]


def test_it_moves_on_when_the_broker_refuses_without_calling_the_provider():
    h = Harness(strategy="price")  # cheapest first: a, then b
    for k in range(3):
        h.send(1000.0 + k * 0.01)
    h.loop.run(1100.0)
    # a's gateway-side bucket holds 2 requests per minute: the third went to b at once.
    assert h.behaviours["a"].counters.requests == 2
    assert h.behaviours["b"].counters.requests == 1
    assert h.stats.broker_refusals == 1 and h.stats.provider_429 == 0


def test_it_waits_for_capacity_and_counts_the_wait_in_ttft():
    config = CONFIG.replace(
        "      - {provider: b, upstream_model: m, price: {input: 1.00, cached_input: 1.00, output: 2.00}, context_window: 100000, max_output: 4096}\n",
        "",
    )
    config = config.replace("capacity: 2, per: 1m", "capacity: 1, per: 6s")
    h = Harness(config=config)
    h.send(1000.0)
    second = h.send(1000.0)
    h.loop.run(1100.0)
    s = h.stats
    assert s.served == 2 and s.broker_refusals == 1 and second.broker_refusals == 1
    # The second waited in a's queue for the refill (6 s for one request; the pool's pump wakes
    # up to 0.25 s later, jittered) before its 0.3 s TTFT.
    assert 0.3 + 6.3 <= s.ttft_sum <= 0.3 + 6.3 + 0.25


def test_it_refuses_for_capacity_when_nothing_fits_before_the_deadline():
    config = CONFIG.replace(
        "      - {provider: b, upstream_model: m, price: {input: 1.00, cached_input: 1.00, output: 2.00}, context_window: 100000, max_output: 4096}\n",
        "",
    )
    config = config.replace("capacity: 2, per: 1m", "capacity: 1, per: 1m")
    h = Harness(config=config)
    h.send(1000.0)
    h.send(1000.0)
    h.loop.run(1100.0)
    assert h.stats.served == 1 and h.stats.capacity_failures == 1
    assert [t for _, t in h.follow_ups] == [False, False]  # both turns ended


def test_it_pauses_a_provider_after_its_429_and_falls_back():
    # b is now the cheaper one, and its concurrency of 1 is unknown to the gateway: the second
    # request meets a provider 429, falls back to a, and b is paused in the broker.
    config = CONFIG.replace(
        "input: 1.00, cached_input: 1.00, output: 2.00",
        "input: 0.01, cached_input: 0.01, output: 0.02",
    )
    config = config.replace(
        "    base_url: http://127.0.0.1:2/v1\n",
        "    base_url: http://127.0.0.1:2/v1\n    limits:\n      - {dimension: requests, capacity: 1000, per: 1m}\n",
    )
    h = Harness(config=config, strategy="price")
    first = h.send(1000.0)
    second = h.send(1000.1)
    third = h.send(1000.5)  # after the 429 came back (0.2 s), within b's Retry-After (1 s)
    h.loop.run(1100.0)
    assert h.behaviours["b"].counters.rate_limited["concurrency"] == 1
    assert (first.provider_429, first.attempts) == (0, 1)
    assert (second.provider_429, second.attempts) == (1, 2)  # fell back to a
    assert (third.provider_429, third.broker_refusals, third.attempts) == (0, 1, 1)
    assert h.stats.served == 3


def test_it_learns_the_concurrency_limit_a_provider_does_not_publish():
    # b is the cheaper one; its concurrency of 1 is unknown to the gateway. A request every
    # 0.5 s for two minutes, each 2.5 s long at b: b is over its limit all the time.
    config = CONFIG.replace(
        "input: 1.00, cached_input: 1.00, output: 2.00",
        "input: 0.01, cached_input: 0.01, output: 0.02",
    )

    def provider_429s(learn_concurrency: bool) -> int:
        h = Harness(config=config, strategy="price", learn_concurrency=learn_concurrency)
        for k in range(240):
            h.send(1000.0 + 0.5 * k)
        h.loop.run(1300.0)
        return h.behaviours["b"].counters.rate_limited["concurrency"]

    told, learned = provider_429s(False), provider_429s(True)
    assert told >= 100  # nearly every request meets a 429 there before it falls back
    # It waits for b's slot instead, and meets a 429 only when the limit grows past 1 (each 5 s).
    assert learned <= told / 5


def test_it_keeps_a_conversation_where_its_cache_is_warm():
    h = Harness(strategy="price_only")
    h.router.default_strategy = "price_only"
    conversation = Conversation("c1", [4000, 6000], [100, 100], tools=False)
    h.send(1000.0, conversation=conversation, input_tokens=4000)
    h.loop.run(1010.0)
    pinned = conversation.sticky
    assert pinned is not None and pinned.prefix_tokens == 4100
    conversation.turn = 1
    h.send(1020.0, conversation=conversation, input_tokens=6000)
    h.loop.run(1100.0)
    assert conversation.sticky.endpoint_id == pinned.endpoint_id
    expected = (4000 // 128) * 128 if pinned.endpoint_id == "t/m@a" else 0
    assert h.stats.cached_input_tokens == expected  # a caches a warm prefix (hit rate 1)


def test_it_counts_broker_refusals_but_tells_the_router_only_what_providers_answered():
    # As the gateway does: the broker's refusals are our own rationing, not the endpoint's 429s.
    h = Harness(strategy="price")
    requests = [h.send(1000.0 + k * 0.01) for k in range(5)]
    h.loop.run(1100.0)
    assert sum(r.broker_refusals for r in requests) >= 3
    assert h.router.stats["t/m@a"].get("rl", 0) == 0
