"""The simulated gateway's streams that reserve output in steps (C10), against hand-computed
cases: the first step at admission, a top-up each time fewer than half a step is left, a refused
step that stops the asking but not the answer, and the settle that charges what was made."""

from __future__ import annotations

import dataclasses
import random

import pytest
import yaml

from configfile import config_parse
from quotas.core.model import BucketSpec, Dimension
from quotas.store.memory import MemoryReservationStore
from routing.core import Router
from simulator.model import parse_market_text
from simulator.switchback.admission import LEASE_S
from simulator.switchback.gateway import SimGateway
from simulator.switchback.loop import EventLoop
from simulator.switchback.market import market_build
from simulator.switchback.metrics import Recorder
from simulator.switchback.traffic import SimRequest

# One provider: TTFT 0.3 s, 100 tokens/s, exactly. Its output bucket is a daily window (no
# refill), so every level below is plain arithmetic. Unless a test says otherwise the bucket
# counts what is reserved, as a tenant's own limit does, not max_tokens as the provider's
# would (``BucketSpec.counts_max_output``): these tests are of the steps themselves. Streams reserve in steps of 100 tokens
# (headroom 50: the next step is asked at the token that leaves fewer than 50 reserved).
CONFIG = """
providers:
  - name: a
    protocol: openai
    base_url: http://127.0.0.1:1/v1
    limits:
      - LIMIT
models:
  - slug: t/m
    endpoints:
      - {provider: a, upstream_model: m, price: {input: 1.00, cached_input: 1.00, output: 2.00}, context_window: 100000, max_output: 4096}
workload_classes:
  - {name: interactive, deadline: 10s, max_queue_depth: 100, overload: reject, weight: 8, retry_budget: 2, stream_reservation: MODE, stream_step_tokens: 100}
"""
MARKET = """
providers:
  - name: a
    port: 0
    protocol: openai
    limits: {requests_per_minute: 1000PROVIDER_LIMITS}
    models:
      m: {ttft_ms: {median: 300, p95: 300}, tokens_per_s: {median: 100, p05: 100}, error_rate: 0.0}
traffic:
  duration: 1d
  models:
    t/m: {requests_per_minute: {mean: 1}, input_tokens: {median: 500, p95: 500}, output_tokens: {median: 100, p95: 100}}
"""
START = 1000.0  # 00:16:40 UTC on day 0: inside one daily window for the whole test


DAILY = (
    '{dimension: output_tokens, capacity: OUTPUT, window: day, resets_at: "00:00", timezone: UTC}'
)


class Harness:
    def __init__(
        self,
        *,
        output_capacity: int,
        mode: str = "increments",
        limit: str = DAILY,
        provider_limits: str = "",
        counts_max_output: bool = False,
    ):
        config = CONFIG.replace("LIMIT", limit).replace("OUTPUT", str(output_capacity))
        config = config.replace("MODE", mode)
        self.loop = EventLoop(START)
        sim = market_build(
            config_parse(yaml.safe_load(config)),
            parse_market_text(MARKET.replace("PROVIDER_LIMITS", provider_limits)),
            scale=1.0,
            rng=random.Random(1),
            origin=START,
            headroom_s=0.0,
            learn_concurrency=False,
        )
        route = sim.routes["t/m@a"]
        sim.routes["t/m@a"] = dataclasses.replace(
            route,
            buckets=tuple(
                dataclasses.replace(b, counts_max_output=counts_max_output) for b in route.buckets
            ),
        )
        self.behaviour = sim.behaviours["a"]
        self.store = MemoryReservationStore(clock=lambda: self.loop.now, lease_seconds=LEASE_S)
        self.recorder = Recorder(
            routes=sim.route_names, endpoints=sim.endpoint_ids, slots=1, origin=START, bin_s=60.0
        )
        self.bucket: BucketSpec = next(
            b for b in sim.routes["t/m@a"].buckets if b.dimension is Dimension.OUTPUT_TOKENS
        )
        self.gateway = SimGateway(
            loop=self.loop,
            router=Router(sim.models),
            store=self.store,
            routes=sim.routes,
            workload=sim.workload,
            recorder=self.recorder,
            rng=random.Random(2),
            classify=lambda request: 0,
            follow_up=lambda request, tool: None,
        )

    def send(self, *, output_tokens: int, max_tokens: int = 512) -> SimRequest:
        request = SimRequest(
            model="t/m",
            arrival=START,
            input_tokens=500,
            output_tokens=output_tokens,
            max_tokens=max_tokens,
        )
        self.loop.schedule(START, self.gateway.arrive, request)
        return request

    def left_at(self, t: float) -> float:
        """The output bucket's level at ``START + t`` (running the loop up to then)."""
        self.loop.run(START + t)
        return self.store.levels([self.bucket], now=self.loop.now)[0].available


def test_it_reserves_the_first_step_and_tops_up_as_the_tokens_arrive():
    h = Harness(output_capacity=1000)
    h.send(output_tokens=250)
    # Tokens: the first at 0.3 s, then one per 10 ms; token n at 0.3 + (n - 1) / 100 s.
    assert h.left_at(0.1) == pytest.approx(900)  # admitted: the first step, 100
    assert h.left_at(0.79) == pytest.approx(900)  # token 50 at 0.79 s: 50 left, no step yet
    assert h.left_at(0.801) == pytest.approx(800)  # token 51 leaves 49 < 50: the next 100
    assert h.left_at(1.79) == pytest.approx(800)
    assert h.left_at(1.801) == pytest.approx(700)  # token 151: reserved 300
    # Token 251 would ask again, but the answer ends at 250 (0.3 + 2.5 = 2.8 s), settled at
    # its real 250: 50 of the 300 come back.
    assert h.left_at(2.79) == pytest.approx(700)
    assert h.left_at(3.0) == pytest.approx(750)
    s = h.recorder.slots[0]
    assert (s.served, s.output_tokens, s.steps_granted, s.steps_refused) == (1, 250, 2, 0)
    assert (s.over_reserved_tokens, s.unreserved_tokens) == (50, 0)
    # Held beyond what was made, over the answer: 100 × 0.8 s + 200 × 1 s + 300 × 1 s reserved,
    # less Σ over the 250 tokens of the time each counted (250 · 251 / 2 / 100 token-seconds).
    assert h.recorder.tallies == {
        (0, "held:t/m@a"): round(580 - 313.75),
        (0, "answers:t/m@a"): 1,
        (0, "output:t/m@a"): 250,
    }


def test_it_stops_asking_after_a_refused_step_but_serves_the_whole_answer():
    h = Harness(output_capacity=150)
    request = h.send(output_tokens=250)
    assert h.left_at(0.1) == pytest.approx(50)  # the first step fits
    # At token 51 the next 100 do not fit in the 50 left: refused, nothing taken, and no
    # step is asked again (token 151 passes without one).
    assert h.left_at(0.801) == pytest.approx(50)
    assert h.left_at(2.79) == pytest.approx(50)
    # The answer is not cut: all 250 tokens are served, and the settle charges them all, so
    # the bucket is over-used by the 150 made beyond the 100 reserved.
    assert h.left_at(3.0) == pytest.approx(150 - 250)
    s = h.recorder.slots[0]
    assert (s.served, s.output_tokens, s.steps_granted, s.steps_refused) == (1, 250, 0, 1)
    assert (s.over_reserved_tokens, s.unreserved_tokens) == (0, 150)
    assert h.recorder.tallies[(0, f"step:{h.bucket.name}")] == 1
    assert h.recorder.tallies[(0, "output:t/m@a")] == 250
    assert request.broker_refusals == 0  # a step's refusal is not an admission's


def test_it_gives_back_what_a_short_answer_did_not_use():
    h = Harness(output_capacity=1000)
    h.send(output_tokens=30)
    assert h.left_at(0.1) == pytest.approx(900)
    assert h.left_at(0.61) == pytest.approx(970)  # ended at 0.3 + 0.3 s with 30: 70 back
    s = h.recorder.slots[0]
    assert (s.steps_granted, s.over_reserved_tokens) == (0, 70)


def test_it_reserves_the_whole_maximum_in_max_mode():
    h = Harness(output_capacity=1000, mode="max")
    h.send(output_tokens=250)
    assert h.left_at(0.1) == pytest.approx(1000 - 512)  # max_tokens, held to the end
    assert h.left_at(2.79) == pytest.approx(1000 - 512)
    assert h.left_at(3.0) == pytest.approx(750)
    s = h.recorder.slots[0]
    assert (s.steps_granted, s.over_reserved_tokens) == (0, 512 - 250)
    assert h.recorder.tallies[(0, "held:t/m@a")] == round(512 * 2.8 - 313.75)


def test_it_admits_in_steps_a_stream_whose_maximum_would_not_fit():
    # A bucket of 400: reserve-max (512) can never fit and is refused; in steps the first 100
    # fit, and so do three more steps (the answer makes 350, the lease holds 400).
    steps = Harness(output_capacity=400)
    steps.send(output_tokens=350)
    steps.loop.run(START + 60.0)
    assert (steps.recorder.slots[0].served, steps.recorder.slots[0].steps_granted) == (1, 3)
    assert steps.left_at(60.0) == pytest.approx(50)
    whole = Harness(output_capacity=400, mode="max")
    whole.send(output_tokens=350)
    whole.loop.run(START + 60.0)
    assert whole.recorder.slots[0].served == 0
    assert whole.recorder.slots[0].capacity_failures == 1


def test_it_switches_mode_for_the_streams_that_arrive_after():
    h = Harness(output_capacity=1000)
    h.gateway.reserve_streams("max")
    assert h.gateway.step_plan is None
    h.gateway.reserve_streams("increments")
    assert h.gateway.step_plan is not None and h.gateway.step_plan.step_tokens == 100
    with pytest.raises(ValueError, match="max or increments"):
        h.gateway.reserve_streams("some")


@pytest.mark.parametrize(
    ("mode", "counts_max_output", "provider_429s"),
    [("max", False, 0), ("increments", False, 1), ("increments", True, 0)],
)
def test_it_steps_only_where_the_bucket_does_not_count_max_tokens(
    mode, counts_max_output, provider_429s
):
    # The provider debits max_tokens (512) from its own 1,000 output tokens a minute when it
    # accepts a call, as the broker's reserve-max does. Two streams at once: reserve-max lets the
    # second wait for the 24 tokens it lacks (1.44 s of refill) and the provider takes it. A
    # bucket for that limit that counted steps would hold 100 + 100 and send both, and the
    # provider would refuse the second; one that counts max_tokens (as the gateway's provider
    # buckets do) holds 512 for each stream in steps too, and the second waits.
    h = Harness(
        output_capacity=1000,
        mode=mode,
        limit="{dimension: output_tokens, capacity: 1000, per: 1m}",
        provider_limits=", output_tokens_per_minute: 1000",
        counts_max_output=counts_max_output,
    )
    first, second = h.send(output_tokens=50), h.send(output_tokens=50)
    h.loop.run(START + 60.0)
    assert h.behaviour.counters.rate_limited["output_tokens_per_minute"] == provider_429s
    assert (first.provider_429, second.provider_429) == (0, provider_429s)
