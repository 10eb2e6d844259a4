"""Several keys per provider organisation (SPEC B2, issue 18): each key's own limits apply
before the organisation's, its headers describe them, and what each key sent is counted."""

from dataclasses import replace

import pytest

from simulator.model import LimitsSpec, MarketError, Plan, Rejection
from simulator.model._reader import Node
from simulator.model.market import KeySpec, parse_provider

from .helpers import behaviour, provider, request


def pooled(org: LimitsSpec, **keys: LimitsSpec):
    spec = provider(limits=org)
    pool = tuple(KeySpec(name=name, key=f"sk-{name}", limits=lim) for name, lim in keys.items())
    return behaviour(replace(spec, keys=pool))


def test_a_keys_own_limit_refuses_while_the_organisation_and_other_keys_still_serve():
    b = pooled(
        LimitsSpec(requests_per_minute=100),
        small=LimitsSpec(requests_per_minute=2),
        big=LimitsSpec(requests_per_minute=50),
    )
    assert all(isinstance(b.admit(0.0, request(max_tokens=1), "small"), Plan) for _ in range(2))

    refused = b.admit(0.0, request(max_tokens=1), "small")
    other = b.admit(0.0, request(max_tokens=1), "big")

    assert isinstance(refused, Rejection) and refused.reason == "requests_per_minute"
    assert refused.limit == 2  # the key's limit refused, and its headers say so
    assert isinstance(other, Plan)
    assert other.limits.get("requests").limit == 50
    stats = b.stats()["keys"]
    assert stats["small"] == {
        "requests": 3,
        "admitted": 2,
        "input_tokens": 200,
        "rate_limited": 1,
        "unauthorized": 0,
    }


def test_the_organisations_shared_limit_binds_every_key_and_a_refusal_takes_nothing_from_the_key():
    b = pooled(
        LimitsSpec(input_tokens_per_minute=300),
        k1=LimitsSpec(requests_per_minute=10),
        k2=LimitsSpec(requests_per_minute=10),
    )
    assert isinstance(b.admit(0.0, request(input_tokens=200, max_tokens=1), "k1"), Plan)

    refused = b.admit(0.0, request(input_tokens=200, max_tokens=1), "k2")

    assert isinstance(refused, Rejection) and refused.reason == "input_tokens_per_minute"
    # k2's own request bucket got its request back: the organisation refused, not k2.
    assert b.key_limits["k2"].status(0.0).get("requests").remaining == 10
    # Headers describe the key's request limit and the organisation's token limit.
    described = {d.dimension: d.limit for d in refused.limits.dimensions}
    assert described == {"input_tokens": 300, "requests": 10}


def test_finishing_frees_the_keys_concurrency_slot_too():
    b = pooled(LimitsSpec(), one=LimitsSpec(concurrency=1))
    plan = b.admit(0.0, request(max_tokens=5), "one")
    assert isinstance(plan, Plan)
    assert isinstance(b.admit(0.0, request(max_tokens=5), "one"), Rejection)

    b.finish(1.0, plan, 5)

    assert isinstance(b.admit(1.0, request(max_tokens=5), "one"), Plan)


def market_provider(keys: object) -> dict:
    return {
        "name": "p",
        "port": 0,
        "protocol": "openai",
        "models": {
            "m": {"ttft_ms": {"median": 1, "p95": 1}, "tokens_per_s": {"median": 9, "p05": 9}}
        },
        "keys": keys,
    }


def test_the_market_file_reads_keys_with_names_limits_and_revocations():
    spec = parse_provider(
        Node(
            market_provider(
                [
                    {"key": "sk-a", "limits": {"requests_per_minute": 5}},
                    {"name": "old", "key": "sk-b", "revoked": True},
                ]
            ),
            "providers[0]",
        )
    )

    assert spec.keys == (
        KeySpec("key-1", "sk-a", LimitsSpec(requests_per_minute=5)),
        KeySpec("old", "sk-b", LimitsSpec(), revoked=True),
    )


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ([{"key": "sk-a"}, {"key": "sk-a"}], "providers[0].keys[1].key: duplicate 'sk-a'"),
        (
            [{"key": "sk-a", "revoked": "yes"}],
            "providers[0].keys[0].revoked: must be true or false",
        ),
        ([{"key": "sk-a", "limit": {}}], "providers[0].keys[0]"),
    ],
)
def test_the_market_file_refuses_bad_keys_by_their_path(keys, message):
    with pytest.raises(MarketError) as raised:
        parse_provider(Node(market_provider(keys), "providers[0]"))

    assert str(raised.value).startswith(message), str(raised.value)
