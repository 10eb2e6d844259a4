"""Traffic from the market file: diurnal rate, conversations, tools, whales."""

import functools
import math
import random
import statistics

import pytest

from simulator.model import parse_market_text
from simulator.switchback.loop import EventLoop
from simulator.switchback.traffic import Traffic, diurnal_factor, max_tokens_for

from .helpers import REFERENCE_MARKET

MARKET = parse_market_text(REFERENCE_MARKET.read_text())


@functools.cache
def run_traffic(hours: float, *, scale: float = 1.0, seed: int = 1, start: float = 0.0):
    loop = EventLoop(start)
    seen = []
    traffic = Traffic(
        MARKET.traffic,
        loop=loop,
        sink=seen.append,
        rng=random.Random(seed),
        scale=scale,
        origin=0.0,
        until=start + hours * 3600,
        max_input_tokens={},
    )

    def sink(request):
        seen.append(request)
        # Each turn ends at once; the conversation's next turn follows after its delay.
        traffic.follow_up(request, False)

    traffic.sink = sink
    traffic.start()
    loop.run(start + hours * 3600)
    return seen


def test_it_swings_the_rate_over_the_day_around_its_mean():
    assert diurnal_factor(0.0, 0.5) == pytest.approx(0.5)  # local midnight: the trough
    assert diurnal_factor(43200.0, 0.5) == pytest.approx(1.5)  # noon: the peak
    day = [diurnal_factor(t, 0.5) for t in range(0, 86400, 60)]
    assert statistics.fmean(day) == pytest.approx(1.0, abs=1e-9)


def test_it_sends_the_market_files_mean_rate_of_requests():
    seen = run_traffic(24, scale=0.2)
    per_route = {name: 0 for name in MARKET.traffic.models}
    for r in seen:
        if r.pinned is None:
            per_route[r.model] += 1
    for name, spec in MARKET.traffic.models.items():
        expected = spec.requests_per_minute.mean * 0.2 * 1440
        assert per_route[name] == pytest.approx(expected, rel=0.05), name


def test_it_sends_more_at_noon_than_at_midnight():
    seen = run_traffic(24, scale=0.2)
    small = [r for r in seen if r.model == "acme/chat-small"]
    night = sum(1 for r in small if r.arrival < 2 * 3600 or r.arrival >= 22 * 3600)
    noon = 2 * sum(1 for r in small if 11 * 3600 <= r.arrival < 13 * 3600)
    assert noon > 1.8 * night  # amplitude 0.4: 1.4 / 0.6 at the extremes


def test_it_groups_requests_into_conversations_with_growing_prompts():
    seen = run_traffic(24, scale=0.2)
    large = [r for r in seen if r.model == "acme/chat-large" and r.pinned is None]
    by_conversation = {}
    for r in large:
        by_conversation.setdefault(r.conversation.id, []).append(r)
    planned = [len(turns[0].conversation.prompts) for turns in by_conversation.values()]
    assert statistics.fmean(planned) == pytest.approx(4.0, rel=0.1)  # conversation_turns.mean
    for turns in by_conversation.values():
        assert [r.input_tokens for r in turns] == sorted(r.input_tokens for r in turns)
        assert [r.arrival for r in turns] == sorted(r.arrival for r in turns)
    # chat-small has no conversation_turns: every request is its own conversation.
    small = [r for r in seen if r.model == "acme/chat-small"]
    assert all(len(r.conversation.prompts) == 1 for r in small)


def test_it_keeps_the_file_s_prompt_and_answer_distributions():
    seen = run_traffic(24, scale=0.2)
    large = [r for r in seen if r.model == "acme/chat-large" and r.pinned is None]
    prompts = sorted(r.input_tokens for r in large)
    answers = sorted(r.output_tokens for r in large)
    assert statistics.median(prompts) == pytest.approx(3000, rel=0.1)
    assert prompts[int(0.95 * len(prompts))] == pytest.approx(24000, rel=0.2)
    assert statistics.median(answers) == pytest.approx(350, rel=0.1)


def test_it_gives_tools_to_the_tool_share_of_conversations():
    seen = run_traffic(24, scale=0.2)
    conversations = {
        id(r.conversation): r.conversation for r in seen if r.model == "acme/chat-large"
    }
    share = sum(c.tools for c in conversations.values()) / len(conversations)
    assert share == pytest.approx(0.3, abs=0.05)
    assert all(not r.tools for r in seen if r.model == "acme/chat-small")


def test_it_sends_the_whale_only_in_its_window_and_pinned():
    seen = run_traffic(4, scale=0.2, start=48 * 3600)
    whale = [r for r in seen if r.pinned is not None]
    assert {r.pinned for r in whale} == {"gamma"}
    assert all(50 * 3600 <= r.arrival < 52 * 3600 for r in whale)
    assert len(whale) == pytest.approx(270 * 0.2 * 120, rel=0.1)


def test_it_asks_max_tokens_at_the_power_of_two_above_the_p95():
    large = MARKET.traffic.models["acme/chat-large"]
    small = MARKET.traffic.models["acme/chat-small"]
    assert max_tokens_for(large) == 2048 and max_tokens_for(small) == 1024
    assert all(math.log2(max_tokens_for(m)).is_integer() for m in (large, small))


def test_it_is_deterministic_under_its_seed():
    a = [(r.model, r.arrival, r.input_tokens) for r in run_traffic(2, scale=0.1, seed=3)]
    b = [(r.model, r.arrival, r.input_tokens) for r in run_traffic(2, scale=0.1, seed=3)]
    assert a == b
