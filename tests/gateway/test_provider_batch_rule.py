"""E5: the rule that sends a Batch API batch to a provider's own batch API, clause by clause,
and the batch price it is reconciled at."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gateway.provider_batch_rule import LINES, PROVIDER, batch_price, path_rule
from routing.catalogue import EndpointEntry, ProviderEntry

PROVIDER_ENTRY = ProviderEntry(
    id=1, name="alpha", protocol="openai", base_url="http://x/v1", api_key="k", cache_ttl_seconds=0
)
ENDPOINT = EndpointEntry(
    id=1,
    key="acme/chat@alpha",
    model_id=1,
    model_slug="acme/chat",
    provider=PROVIDER_ENTRY,
    upstream_model="chat",
    price_input=0.5,
    price_cached_input=0.05,
    price_output=1.5,
    context_window=32_000,
    max_output=4096,
    supports=frozenset(),
    batch_api=True,
    batch_discount=0.5,
    batch_turnaround=3600.0,
)
SENT: dict[str, Any] = {
    "metadata": None,
    "url": "/v1/chat/completions",
    "models": {"acme/chat"},
    "endpoint": ENDPOINT,
    "may_use": True,
    "routed": False,
    "translates": True,
    "window_left": 86_000.0,
    "spend_estimate": 1.0,
    "spend_room": 5.0,
}


def test_it_sends_a_batch_that_meets_every_clause_to_the_provider():
    choice = path_rule(**SENT)

    assert choice.path == PROVIDER and "acme/chat@alpha" in choice.why


def test_a_batch_without_a_spend_budget_is_not_held_back_by_one():
    assert path_rule(**{**SENT, "spend_room": None}).path == PROVIDER


KEPT_HERE = {
    "the caller opts out": ({"metadata": {"switchyard_batch_path": "lines"}}, "asked"),
    "embeddings": ({"url": "/v1/embeddings"}, "/v1/embeddings"),
    "two models": ({"models": {"acme/chat", "acme/other"}}, "more than one model"),
    "no batch endpoint": ({"endpoint": None}, "no endpoint"),
    "a model the key may not use": ({"may_use": False}, "no endpoint"),
    "a line routes itself": ({"routed": True}, "its own routing"),
    "a line the wire cannot say": ({"translates": False}, "does not translate"),
    "the window is too short": ({"window_left": 3599.0}, "turnaround"),
    "the spend budget is short": ({"spend_estimate": 5.01}, "spend budget"),
}


@pytest.mark.parametrize(("change", "words"), KEPT_HERE.values(), ids=list(KEPT_HERE))
def test_it_keeps_the_line_by_line_path_and_says_which_clause(change, words):
    choice = path_rule(**{**SENT, **change})

    assert choice.path == LINES and words in choice.why


def test_the_opt_out_names_only_the_line_path():
    assert path_rule(**{**SENT, "metadata": {"switchyard_batch_path": "auto"}}).path == PROVIDER


def test_the_batch_price_is_the_endpoints_less_its_discount():
    priced = batch_price(replace(ENDPOINT, batch_discount=0.4))

    assert (priced.price_input, priced.price_cached_input, priced.price_output) == pytest.approx(
        (0.3, 0.03, 0.9)
    )
    cost = priced.cost(input_tokens=1_000_000, cached_input_tokens=0, output_tokens=1_000_000)
    assert cost == pytest.approx(1.2)
