"""Live endpoint statistics: decayed sums, priors, merging (SPEC G2–G10)."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.core import EndpointConfig, ModelConfig, Router
from routing.core.parameters import RoutingParameters
from routing.core.stats import (
    Outcome,
    endpoint_estimate,
    endpoint_observe,
    model_figures,
    stats_merge,
    traffic_merge,
    traffic_observe,
)

P = RoutingParameters()
OK = Outcome(kind="ok", latency_s=5.0, ttft_s=1.0, input_tokens=1000, output_tokens=400)


def figures(states=(), traffic=None, now=0.0, params=P):
    return model_figures(
        list(states),
        traffic or {},
        now,
        params,
        default_input_tokens=1000.0,
        default_output_tokens=400.0,
    )


def test_it_estimates_a_new_endpoint_from_the_model_defaults_with_no_history():
    est = endpoint_estimate({}, figures(), 123.0, P)
    assert est.ttft_s == P.default_ttft_s
    assert math.isclose(est.tokens_per_s, P.default_tokens_per_s)
    assert est.fault_rate == P.default_fault_rate
    assert est.rate_limited_rate == P.default_rate_limited_rate
    assert est.cap_rps == 0.0 and est.attempt_rate == 0.0


def test_it_uses_peers_medians_as_a_new_endpoints_prior():
    fast, slow = {}, {}
    for k in range(200):
        endpoint_observe(fast, Outcome("ok", latency_s=2.5, ttft_s=0.5, output_tokens=200), k, P)
        endpoint_observe(slow, Outcome("ok", latency_s=4.5, ttft_s=0.5, output_tokens=200), k, P)
    fig = figures([fast, slow, {}], now=200.0)
    new = endpoint_estimate({}, fig, 200.0, P)
    assert math.isclose(new.ttft_s, 0.5, rel_tol=1e-6)
    assert math.isclose(new.tokens_per_s, (100.0 + 50.0) / 2, rel_tol=1e-6)


def test_it_decays_errors_with_the_fast_half_life():
    params = RoutingParameters(prior_attempts=1e-9)
    state: dict[str, float] = {}
    for _ in range(100):
        endpoint_observe(state, Outcome("fault"), 0.0, params)
    endpoint_observe(state, OK, params.fast_half_life_s, params)  # one half-life later
    # 100 faults now weigh 50 against 1 fresh success.
    est = endpoint_estimate(state, figures(params=params), params.fast_half_life_s, params)
    assert math.isclose(est.fault_rate, 50.0 / 51.0, rel_tol=1e-6)
    assert math.isclose(state["n"], 51.0, rel_tol=1e-9)


def test_it_decays_speed_slower_than_errors():
    state: dict[str, float] = {}
    endpoint_observe(state, Outcome("ok", latency_s=6.0, ttft_s=5.0, output_tokens=100), 0.0, P)
    endpoint_observe(state, Outcome("fault"), 0.0, P)
    before = dict(state)
    endpoint_observe(state, Outcome("ignored"), 60.0, P)  # the caller's fault: no change
    assert state == before
    est = endpoint_estimate(state, figures(), 60.0, P)
    d_fast = 2 ** (-60 / P.fast_half_life_s)
    d_speed = 2 ** (-60 / P.speed_half_life_s)
    expected_fault = (d_fast + P.prior_attempts * P.default_fault_rate) / (
        2 * d_fast + P.prior_attempts
    )
    expected_ttft = (5.0 * d_speed + P.prior_answers * P.default_ttft_s) / (
        d_speed + P.prior_answers
    )
    assert math.isclose(est.fault_rate, expected_fault, rel_tol=1e-9)
    assert math.isclose(est.ttft_s, expected_ttft, rel_tol=1e-9)
    # After 60 s the fault kept a quarter of its weight, the TTFT sample 87 %.
    assert d_fast == 0.25 and d_speed > 0.87


def test_it_handles_irregular_sample_times_like_exact_weights():
    params = RoutingParameters(prior_answers=1e-9)
    times = [0.0, 0.3, 7.0, 7.1, 250.0]
    ttfts = [1.0, 2.0, 3.0, 4.0, 5.0]
    state: dict[str, float] = {}
    for t, ttft in zip(times, ttfts, strict=True):
        endpoint_observe(state, Outcome("ok", latency_s=10.0, ttft_s=ttft), t, params)
    now = 300.0
    weights = [2 ** (-(now - t) / params.speed_half_life_s) for t in times]
    expected = sum(w * x for w, x in zip(weights, ttfts, strict=True)) / sum(weights)
    est = endpoint_estimate(state, figures(params=params), now, params)
    assert math.isclose(est.ttft_s, expected, rel_tol=1e-6)


def test_it_weights_cache_hits_by_tokens():
    params = RoutingParameters(prior_answers=1e-9)
    state: dict[str, float] = {}
    endpoint_observe(state, Outcome("ok", input_tokens=9000, cached_input_tokens=9000), 0, params)
    endpoint_observe(state, Outcome("ok", input_tokens=1000, cached_input_tokens=0), 0, params)
    est = endpoint_estimate(state, figures(params=params), 0.0, params)
    assert math.isclose(est.cache_hit_rate, 0.9, rel_tol=1e-6)  # not the per-request 0.5


def test_it_tracks_the_models_request_shape_and_io_ratio():
    traffic: dict[str, float] = {}
    for k in range(1000):
        traffic_observe(traffic, Outcome("ok", input_tokens=3000, output_tokens=300), k * 0.1, P)
    fig = figures(traffic=traffic, now=100.0)
    assert math.isclose(fig.input_tokens, 3000.0, rel_tol=0.01)
    assert math.isclose(fig.output_per_input, 0.1, rel_tol=0.01)


def test_it_counts_a_late_sample_as_already_decayed():
    params = RoutingParameters(prior_attempts=1e-9)
    state: dict[str, float] = {}
    endpoint_observe(state, OK, 100.0, params)
    endpoint_observe(state, Outcome("fault"), 100.0 - params.fast_half_life_s, params)
    assert state["t"] == 100.0
    assert math.isclose(state["flt"], 0.5)


outcomes = st.sampled_from(
    [
        OK,
        Outcome("fault", latency_s=0.5),
        Outcome("rate_limited", latency_s=0.2),
        Outcome(
            "ok",
            latency_s=3.0,
            ttft_s=0.2,
            input_tokens=500,
            cached_input_tokens=100,
            output_tokens=50,
            output_checked=True,
            output_bad=True,
        ),
    ]
)
events = st.lists(
    st.tuples(st.floats(min_value=0, max_value=600), outcomes, st.booleans()), max_size=40
)


@settings(max_examples=150, deadline=None)
@given(events)
def test_it_merges_two_processes_into_the_single_process_state(evs):
    params = RoutingParameters(cap_trigger_rate=2.0)  # caps are last-writer, not additive
    evs = sorted(evs, key=lambda e: e[0])
    one: dict[str, float] = {}
    left: dict[str, float] = {}
    right: dict[str, float] = {}
    for t, outcome, side in evs:
        endpoint_observe(one, outcome, t, params)
        endpoint_observe(left if side else right, outcome, t, params)
    merged = stats_merge(left, right, params)
    now = 700.0
    fig = figures(params=params)
    a = endpoint_estimate(one, fig, now, params)
    b = endpoint_estimate(merged, fig, now, params)
    for x, y in zip(a, b, strict=True):
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def test_it_shares_stats_between_gateway_processes_through_flushed_deltas():
    e = EndpointConfig("m@a", "a", "m", 0.5, 0.05, 1.5, 131072, 8192)
    models = [ModelConfig("m", (e,))]
    single = Router(models)
    workers = [Router(models, track_pending=True) for _ in range(2)]
    shared: dict[str, float] = {}
    shared_traffic: dict[str, float] = {}
    for k in range(600):
        t = k * 0.25
        outcome = OK if k % 7 else Outcome("fault", latency_s=0.3)
        single.observe(e.id, outcome, t)
        workers[k % 2].observe(e.id, outcome, t)
        if k % 40 == 39:  # off the critical path: flush, merge, read back
            for worker in workers:
                deltas, traffic = worker.stats_flush()
                shared = stats_merge(shared, deltas.get(e.id, {}), P)
                shared_traffic = traffic_merge(shared_traffic, traffic.get("m", {}), P)
            for worker in workers:
                worker.stats_load(e.id, shared)
                worker.traffic_load("m", shared_traffic)
    now = 150.0
    a, b = single.table("m", now), workers[0].table("m", now)
    assert a is not None and b is not None
    for x, y in zip(a.estimates[0], b.estimates[0], strict=True):
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(a.figures.input_tokens, b.figures.input_tokens, rel_tol=1e-9)
