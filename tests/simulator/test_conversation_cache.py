"""Conversation-aware prompt caching (the switchback's extension of the behaviour model)."""

import random

from simulator.model import CompletionRequest, Plan, ProviderBehaviour

from .helpers import model, provider


def cached(b: ProviderBehaviour, now: float, conversation: str | None, tokens: int) -> int:
    plan = b.admit(now, CompletionRequest("m", tokens, max_tokens=5, conversation=conversation))
    assert isinstance(plan, Plan)
    b.finish(now, plan, plan.tokens_to_send)
    return plan.cached_input_tokens


def conversational(hit_rate: float = 1.0, ttl: float = 300.0) -> ProviderBehaviour:
    spec = provider(models=[model(cache_hit_rate=hit_rate)])
    return ProviderBehaviour(spec, random.Random(1), 0.0, prompt_cache_ttl_s=ttl)


def test_it_never_hits_on_a_conversation_s_first_request():
    b = conversational()
    assert all(cached(b, float(k), f"c{k}", 8000) == 0 for k in range(50))


def test_it_hits_on_the_previous_prompt_while_the_prefix_is_warm():
    b = conversational()
    assert cached(b, 0.0, "c", 5000) == 0
    hit = cached(b, 60.0, "c", 9000)
    assert hit == (5000 // 128) * 128
    assert cached(b, 120.0, "c", 12000) == (9000 // 128) * 128


def test_it_forgets_a_prefix_after_the_ttl():
    b = conversational(ttl=300.0)
    cached(b, 0.0, "c", 5000)
    assert cached(b, 301.0, "c", 6000) == 0
    assert cached(b, 400.0, "c", 7000) > 0  # the 301 s request warmed it again


def test_it_hits_a_warm_prefix_at_the_configured_rate():
    b = conversational(hit_rate=0.35)
    hits = 0
    for k in range(2000):
        cached(b, 0.0, f"c{k}", 4000)
        hits += cached(b, 10.0, f"c{k}", 5000) > 0
    assert 0.31 < hits / 2000 < 0.39


def test_it_keeps_the_per_request_rule_without_a_conversation():
    b = conversational(hit_rate=1.0)
    assert cached(b, 0.0, None, 4096) > 0


def test_it_is_off_unless_asked_for():
    b = ProviderBehaviour(provider(models=[model(cache_hit_rate=1.0)]), random.Random(1), 0.0)
    assert cached(b, 0.0, "c", 4096) > 0  # the per-request rule, conversation ignored


def test_it_lets_the_caller_fix_the_answer_length():
    b = conversational()
    plan = b.admit(0.0, CompletionRequest("m", 100, max_tokens=500, output_tokens=321))
    assert plan.output_tokens == 321 and plan.stop_reason == "end"
    capped = b.admit(0.0, CompletionRequest("m", 100, max_tokens=200, output_tokens=321))
    assert capped.output_tokens == 200 and capped.stop_reason == "max_tokens"
