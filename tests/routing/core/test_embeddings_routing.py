"""Embeddings in the router (issue 16 item 4): only endpoints that embed serve them, and they
serve nothing else; routing cost without the output terms (max_tokens=0)."""

import random

import pytest

from routing.core import EndpointConfig, ModelConfig, Outcome, Router, RoutingRequest

EMBED = frozenset({"embeddings"})
# e@cheap has the lower input price; e@fast the far lower output price (meaningless here).
CHEAP = EndpointConfig("e@cheap", "cheap", "e", 0.02, 0.02, 50.0, 8192, 1, EMBED)
FAST = EndpointConfig("e@fast", "fast", "e", 0.03, 0.03, 0.0, 8192, 1, EMBED)
CHAT = EndpointConfig("e@chat", "chat", "e", 0.01, 0.01, 0.1, 8192, 4096, frozenset({"stream"}))
NOW = 100.0


@pytest.fixture(scope="module")
def router():
    r = Router([ModelConfig("e", (CHEAP, FAST, CHAT)), ModelConfig("only", (CHEAP, FAST))])
    for k in range(200):
        for e in (CHEAP, FAST, CHAT):
            outcome = Outcome("ok", latency_s=0.05, ttft_s=0.05, input_tokens=500, output_tokens=0)
            r.observe(e.id, outcome, k * 0.5)
    return r


def plan(router, model="e", **kw):
    return router.plan(RoutingRequest(model, **kw), NOW, random.Random(0))


def test_an_embeddings_request_goes_only_to_endpoints_that_embed(router):
    p = plan(router, input_tokens=500.0, max_tokens=0, features=frozenset({"embeddings"}))
    assert {e.provider for e in p.attempts} == {"cheap", "fast"}
    assert ("e@chat", "no_embeddings") in p.refused


def test_a_chat_request_never_goes_to_an_endpoint_that_embeds(router):
    p = plan(router, input_tokens=500.0)
    assert [e.provider for e in p.attempts] == ["chat"]
    assert {("e@cheap", "embeddings_only"), ("e@fast", "embeddings_only")} <= set(p.refused)
    assert plan(router, model="only", input_tokens=500.0).attempts == ()


def test_without_output_terms_the_input_price_decides(router):
    # With even one output token priced in, e@cheap's 50 USD/M output would lose to e@fast.
    p = plan(
        router, model="only", input_tokens=5000.0, max_tokens=0, features=frozenset({"embeddings"})
    )
    assert p.output_tokens == 0.0
    assert p.attempts[0].provider == "cheap"
