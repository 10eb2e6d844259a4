"""One provider's behaviour on a simulated clock: distributions, incidents, failures, caching."""

import json
import random
import statistics
import subprocess
import sys

import pytest

from simulator.model import (
    IncidentSpec,
    LatencySpec,
    LengthSpec,
    LimitsSpec,
    Plan,
    ProviderBehaviour,
    Rejection,
    ThroughputSpec,
    ToolSpec,
    parse_market_text,
)

from .helpers import REFERENCE_MARKET, behaviour, model, provider, request

WEATHER = ToolSpec(
    name="get_weather",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
    },
)


def plans(b: ProviderBehaviour, n: int, **fields) -> list[Plan]:
    out = []
    for i in range(n):
        plan = b.admit(float(i), request(**fields))
        assert isinstance(plan, Plan)
        b.finish(float(i), plan, plan.tokens_to_send)
        out.append(plan)
    return out


def test_it_draws_ttft_and_throughput_around_the_configured_quantiles():
    drawn = plans(behaviour(provider(models=[model(output_tokens=LengthSpec(200, 800))])), 4000)

    ttfts = sorted(p.ttft_s for p in drawn)
    speeds = sorted(p.tokens_per_s for p in drawn)
    outputs = sorted(p.output_tokens for p in drawn if p.stop_reason == "end")
    assert statistics.median(ttfts) == pytest.approx(0.450, rel=0.06)
    assert ttfts[int(0.95 * len(ttfts))] == pytest.approx(1.400, rel=0.12)
    assert statistics.median(speeds) == pytest.approx(70, rel=0.06)
    assert speeds[int(0.05 * len(speeds))] == pytest.approx(30, rel=0.12)
    assert statistics.median(outputs) == pytest.approx(200, rel=0.08)


def test_it_is_deterministic_under_a_seed():
    spec = parse_market_text(REFERENCE_MARKET.read_text()).provider("gamma")
    requests = [
        request("chat-large", 50 + 700 * i, max_tokens=300, tools=(WEATHER,)) for i in range(200)
    ]

    def run(seed):
        b = ProviderBehaviour(spec, random.Random(seed), 0.0)
        out = []
        for i, r in enumerate(requests):
            outcome = b.admit(i * 0.01, r)
            out.append(outcome)
            if isinstance(outcome, Plan):
                b.finish(i * 0.01, outcome, outcome.tokens_to_send)
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_it_switches_a_market_incident_on_and_off_at_the_configured_times():
    alpha = parse_market_text(REFERENCE_MARKET.read_text()).provider("alpha")
    b = ProviderBehaviour(alpha, random.Random(3), started_at=1000.0)
    start, end = 1000.0 + 30 * 3600, 1000.0 + 30 * 3600 + 40 * 60

    assert b.model_at(start - 0.001, "chat-large").spec.error_rate == 0.01
    assert b.model_at(start, "chat-large").spec.error_rate == 0.35
    assert b.model_at(end - 0.001, "chat-large").spec.error_rate == 0.35
    assert b.model_at(end, "chat-large").spec.error_rate == 0.01
    assert b.model_at(start, "chat-small").spec.error_rate == 0.005  # other models unaffected
    assert len(b.active_incidents(start)) == 1 and not b.active_incidents(end)


def test_it_fails_at_the_incident_error_rate_while_the_incident_is_active():
    spec = provider(models=[model(error_rate=0.0)])
    b = behaviour(spec)
    b.start_incident(100.0, IncidentSpec(at=0.0, duration=60.0, model="m", error_rate=0.35))

    def failure_share(start):
        outcomes = [b.admit(start + i * 0.01, request(max_tokens=20)) for i in range(2000)]
        for i, plan in enumerate(outcomes):
            b.finish(start + i * 0.01, plan, 0)
        return sum(plan.status == 500 for plan in outcomes) / len(outcomes)

    assert failure_share(0.0) == 0.0
    assert failure_share(100.0) == pytest.approx(0.35, abs=0.04)
    assert failure_share(160.0) == 0.0


def test_it_overrides_latency_during_an_incident():
    b = behaviour()
    b.start_incident(0.0, IncidentSpec(at=0.0, duration=10.0, ttft_ms=LatencySpec(5000, 5000)))

    during, after = b.admit(1.0, request(max_tokens=5)), b.admit(11.0, request(max_tokens=5))

    assert during.ttft_s == pytest.approx(5.0)
    assert after.ttft_s < 5.0


@pytest.mark.parametrize(("protocol", "status"), [("openai", 503), ("anthropic", 529)])
def test_it_answers_overload_with_the_protocols_status_at_once(protocol, status):
    b = behaviour(provider(protocol=protocol, models=[model(overload_rate=1.0)]))

    plan = b.admit(0.0, request(max_tokens=50))

    assert plan.status == status and plan.failure.kind == "overload"
    assert plan.fails_at_once and plan.duration_s == 0.0 and plan.tokens_to_send == 0


def test_it_breaks_some_errors_mid_answer():
    drawn = plans(behaviour(provider(models=[model(error_rate=1.0)])), 400, max_tokens=100)

    midway = [p for p in drawn if not p.fails_at_once]
    assert 0.4 < len(midway) / len(drawn) < 0.6
    assert all(0 < p.tokens_to_send < p.output_tokens for p in midway)
    assert all(p.duration_s >= p.ttft_s for p in midway)


def test_it_caps_output_at_max_tokens_and_says_so():
    drawn = plans(behaviour(), 500, max_tokens=100)

    assert max(p.output_tokens for p in drawn) == 100
    assert all((p.output_tokens == 100) == (p.stop_reason == "max_tokens") for p in drawn)


def test_it_stops_on_a_given_stop_sequence_for_part_of_the_natural_ends():
    drawn = plans(behaviour(), 300, max_tokens=100000, stop_sequences=("END",))

    stopped = [p for p in drawn if p.stop_reason == "stop_sequence"]
    assert 0.35 < len(stopped) / len(drawn) < 0.65
    assert all(p.stop_sequence == "END" for p in stopped)


def test_it_reports_a_cached_prefix_at_the_cache_hit_rate_for_long_prompts():
    b = behaviour(provider(models=[model(cache_hit_rate=0.4)]))

    long_prompts = plans(b, 2000, input_tokens=5000, max_tokens=5)
    short_prompts = plans(b, 200, input_tokens=1000, max_tokens=5)

    hits = [p for p in long_prompts if p.cached_input_tokens]
    assert len(hits) / len(long_prompts) == pytest.approx(0.4, abs=0.04)
    assert all(
        p.cached_input_tokens % 128 == 0 and 1024 <= p.cached_input_tokens < 5000 for p in hits
    )
    assert not any(p.cached_input_tokens for p in short_prompts)
    assert b.stats()["cached_input_tokens"] == sum(p.cached_input_tokens for p in hits)


@pytest.mark.parametrize(("protocol", "counted"), [("openai", True), ("anthropic", False)])
def test_it_counts_prompt_cache_reads_toward_input_tokens_per_minute_as_the_protocol_does(
    protocol, counted
):
    limits = LimitsSpec(input_tokens_per_minute=1_000_000)
    b = behaviour(provider(protocol=protocol, limits=limits, models=[model(cache_hit_rate=1.0)]))

    plan = b.admit(0.0, request(input_tokens=5000, max_tokens=5))

    assert isinstance(plan, Plan) and plan.cached_input_tokens >= 1024
    used = 1_000_000 - b.limits.input_tokens.level
    expected = 5000 if counted else 5000 - plan.cached_input_tokens
    assert used == pytest.approx(expected)


def test_it_reports_cache_writes_only_when_the_request_asked_for_caching():
    b = behaviour(provider(models=[model(cache_hit_rate=0.0)]))

    asked = plans(b, 5, input_tokens=4096, max_tokens=5, cache_control=True)
    not_asked = plans(b, 5, input_tokens=4096, max_tokens=5)

    assert all(p.cache_creation_input_tokens >= 1024 for p in asked)
    assert not any(p.cache_creation_input_tokens for p in not_asked)


def test_it_calls_a_required_tool_with_arguments_satisfying_the_schema():
    drawn = plans(behaviour(), 100, max_tokens=500, tools=(WEATHER,), tool_choice="required")

    for plan in drawn:
        assert plan.stop_reason == "tool_use" and plan.tool_call.name == "get_weather"
        arguments = json.loads(plan.tool_call.arguments_json)
        assert isinstance(arguments["city"], str) and 1 <= arguments["days"] <= 7
        assert arguments.get("unit", "c") in ("c", "f")


def test_it_calls_tools_at_the_tool_call_rate_when_the_choice_is_auto():
    drawn = plans(
        behaviour(provider(models=[model(tool_call_rate=0.3)])),
        1000,
        max_tokens=500,
        tools=(WEATHER,),
    )
    none = plans(behaviour(), 50, max_tokens=500, tools=(WEATHER,), tool_choice="none")

    assert sum(p.tool_call is not None for p in drawn) / len(drawn) == pytest.approx(0.3, abs=0.05)
    assert not any(p.tool_call for p in none)


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_it_makes_malformed_tool_calls_the_way_each_protocol_can_carry_them(protocol):
    spec = provider(protocol=protocol, models=[model(malformed_tool_call_rate=1.0)])
    drawn = plans(behaviour(spec), 60, max_tokens=500, tools=(WEATHER,), tool_choice="required")

    for plan in drawn:
        assert plan.tool_call.malformed
        if protocol == "openai":
            with pytest.raises(json.JSONDecodeError):
                json.loads(plan.tool_call.arguments_json)
        else:
            arguments = json.loads(plan.tool_call.arguments_json)
            assert not {"city", "days"} <= set(arguments)


def test_it_refuses_unknown_models_and_prompts_over_the_context_window():
    b = behaviour(provider(models=[model(context_window=1000)]))

    unknown, too_long = b.admit(0.0, request("other")), b.admit(0.0, request(input_tokens=1001))

    assert isinstance(unknown, Rejection) and (unknown.status, unknown.reason) == (
        404,
        "model_not_found",
    )
    assert isinstance(too_long, Rejection) and too_long.status == 400
    assert (too_long.limit, too_long.requested) == (1000, 1001)
    assert b.stats()["responses"] == {"400": 1, "404": 1}


def test_it_counts_requests_tokens_and_disconnects():
    b = behaviour(provider(models=[model(output_tokens=LengthSpec(50, 50))]))
    first, second = b.admit(0.0, request(input_tokens=300)), b.admit(0.0, request(input_tokens=200))
    b.finish(1.0, first, first.tokens_to_send)
    b.finish(1.0, second, 7, disconnected=True)

    stats = b.stats()

    assert (stats["requests"], stats["input_tokens"], stats["output_tokens"]) == (2, 500, 57)
    assert stats["responses"] == {"200": 1, "499": 1} and stats["disconnects"] == 1
    assert stats["concurrency"] == 0 and stats["peak_concurrency"] == 2
    assert stats["models"]["m"]["requests"] == 2
    b.reset_counters()
    assert b.stats()["requests"] == 0


def test_it_refuses_to_finish_a_plan_twice():
    b = behaviour()
    plan = b.admit(0.0, request(max_tokens=5))
    b.finish(0.0, plan, 5)

    with pytest.raises(ValueError, match="not open"):
        b.finish(0.0, plan, 5)


def test_it_gives_a_timeline_a_discrete_event_driver_can_schedule():
    b = behaviour(
        provider(models=[model(ttft_ms=LatencySpec(500, 500), tokens_per_s=ThroughputSpec(10, 10))])
    )

    plan = b.admit(0.0, request(max_tokens=21))

    assert plan.duration_s == pytest.approx(0.5 + 21 / 10)
    assert plan.tokens_sent_by(0.49) == 0
    assert plan.tokens_sent_by(0.5) == 1
    assert plan.tokens_sent_by(1.0) == 6
    assert plan.tokens_sent_by(100.0) == 21


def test_it_imports_no_django_asyncio_or_io_frameworks():
    code = "import sys, simulator.model; print(sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'asyncio', 'socket', 'httptools', 'uvloop', 'orjson'}))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )

    assert result.stdout.strip() == "[]"


def test_an_embedding_request_reserves_and_produces_no_output_and_is_never_cached():
    b = behaviour(provider(limits=LimitsSpec(output_tokens_per_minute=1)))
    plan = b.admit(0.0, request(input_tokens=5000, embedding=True))
    assert isinstance(plan, Plan)
    assert plan.reserved_output_tokens == plan.output_tokens == plan.cached_input_tokens == 0
    assert plan.tool_call is None and plan.duration_s == plan.ttft_s
    b.finish(plan.duration_s, plan, 0)
    assert b.stats()["output_tokens"] == 0
