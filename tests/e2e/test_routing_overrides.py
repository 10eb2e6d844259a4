"""Request overrides of the router, end to end (SPEC G13–G15, issue 4).

One test per ``provider`` field and model suffix, a tenant's default sort, bad values, and the
G15 explanation. Expected winners are computed from the reference config's prices and the
market's speeds, never written in: the market here is the reference one without random
failures and with constant speeds (``routing_support.quiet_market``), and the router has seen
real streamed answers from every endpoint first (the fixture's warm-up), so its speed estimates
are measured, not priors.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.routing_support import (
    GLOBEX_KEY,
    KEY,
    chat,
    e2e_throughput,
    endpoints_of,
    geometric_mean,
    incident,
    incident_wait_over,
    quiet_market,
    reference_market,
    route,
    routing_config,
    served_by,
    sim_delta,
    sim_requests,
)
from tests.stack import Stack, free_port, wait_until

pytestmark = pytest.mark.e2e

SCALE = 0.25  # simulated latencies × 0.25: fast, yet far above the gateway's own milliseconds
OUT = 60  # max_tokens of every request here, so the router's output estimate is exactly this
WARM_UP = 20  # streamed answers per endpoint before the tests: the prior (3 answers) fades
LARGE, SMALL = "acme/chat-large", "acme/chat-small"
SHORT = [{"role": "user", "content": "Say something short."}]
# A copy of chat-small for the test that takes a provider down: its live statistics are its own,
# so that test cannot change what the other tests see for chat-small.
ISOLATED = {"slug": "e2e/small", "default_output_tokens": 200, "endpoints": endpoints_of(SMALL)}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        market=quiet_market(tmp_path_factory.mktemp("market")),
        latency_scale=SCALE,
        config_edit=routing_config(free_port(), [ISOLATED]),
    )
    try:
        running.start()
        _warm_up(running)
        yield running
    finally:
        running.stop()


def _warm_up(stack: Stack) -> None:
    """Streamed answers from every chat-large endpoint, so TTFT and speed are measured (G4)."""

    def one(provider: str) -> None:
        with httpx.stream(
            "POST",
            f"{stack.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json=body(LARGE, stream=True, provider={"only": [provider]}),
            timeout=30,
        ) as response:
            assert response.status_code == 200, response.read()
            response.read()

    # gamma is the slowest: it starts first and gets the most workers at once.
    providers = sorted([e["provider"] for e in endpoints_of(LARGE)] * WARM_UP, reverse=True)
    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(one, providers))


def body(model: str = LARGE, **fields) -> dict:
    return {"model": model, "messages": SHORT, "max_tokens": OUT, **fields}


def serve_many(stack: Stack, request: dict, n: int = 6, **kwargs) -> list[httpx.Response]:
    """n identical requests at once (they meet the same routing table, so the same plan)."""
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(lambda _: chat(stack, request, **kwargs), range(n)))


# --- what the market and the price list say -----------------------------------------------


def speeds(slug: str) -> dict[str, tuple[float, float]]:
    """provider → (TTFT s, tokens/s) of a model's endpoints as the simulator runs them here."""
    market = {p["name"]: p["models"] for p in reference_market()["providers"]}
    result = {}
    for e in endpoints_of(slug):
        spec = market[e["provider"]][e["upstream_model"]]
        result[e["provider"]] = (
            spec["ttft_ms"]["median"] / 1000 * SCALE,
            spec["tokens_per_s"]["median"] / SCALE,
        )
    return result


def throughputs(slug: str) -> dict[str, float]:
    """provider → end-to-end output tokens/s of an answer of OUT tokens (TTFT + streaming)."""
    return {p: e2e_throughput(ttft, tps, OUT) for p, (ttft, tps) in speeds(slug).items()}


def listed_prices(slug: str, input_tokens: int) -> dict[str, float]:
    """provider → USD of a short uncached request of OUT output tokens at the listed prices."""
    return {
        e["provider"]: input_tokens * e["price"]["input"] + OUT * e["price"]["output"]
        for e in endpoints_of(slug)
    }


def best(values: dict[str, float], *, highest: bool = False) -> str:
    ranked = sorted(values, key=values.get, reverse=highest)
    # The test is only meaningful if the winner is clear of the runner-up.
    assert values[ranked[0]] != pytest.approx(values[ranked[1]], rel=0.1)
    return ranked[0]


def second(values: dict[str, float], *, highest: bool = False) -> str:
    return sorted(values, key=values.get, reverse=highest)[1]


def refused(response: httpx.Response) -> dict[str, str]:
    """provider → why the plan refused or demoted its endpoint (from the G15 header)."""
    result = {}
    for item in filter(None, route(response).get("refused", "").split(",")):
        _, _, endpoint = item.partition("@")  # "acme/chat-large@beta:max_price"
        provider, _, why = endpoint.partition(":")
        result[provider] = why
    return result


# --- provider.order and allow_fallbacks ----------------------------------------------------


def test_it_tries_providers_in_the_client_order(stack):
    # gamma is the slowest and dearest chat-large endpoint: the algorithm alone seldom picks it.
    responses = serve_many(stack, body(provider={"order": ["gamma", "beta"]}))

    assert {served_by(r) for r in responses} == {"gamma"}
    assert route(responses[0])["strategy"] == "order"
    assert (route(responses[0])["winner"], route(responses[0])["runner_up"]) == ("gamma", "beta")


def test_it_falls_back_in_order_unless_allow_fallbacks_is_false(stack):
    before = sim_requests(stack)
    ends = incident(stack, "gamma", model="chat-small", **{"for": "4s"}, overload_rate=1.0)
    try:
        strict = chat(
            stack,
            body("e2e/small", provider={"order": ["gamma"], "allow_fallbacks": False}),
        )
        strict_attempts = sim_delta(before, sim_requests(stack))
        fallback = chat(stack, body("e2e/small", provider={"order": ["gamma"]}))
    finally:
        incident_wait_over(stack, "gamma", ends)

    print(f"allow_fallbacks=false: {strict.status_code}, simulator saw {strict_attempts}")
    assert strict.status_code >= 500 and strict.json()["error"]["message"]
    # Retries may repeat the same endpoint within the retry budget, but never another provider.
    assert set(strict_attempts) == {("gamma", "chat-small")}
    assert strict_attempts["gamma", "chat-small"] == int(strict.headers["x-switchyard-attempts"])
    assert served_by(fallback) == "alpha"
    assert fallback.headers["x-switchyard-attempts"] == "2"
    # The ledger's attempt timeline (the admin's generation page) tells the same story.
    timeline = stored_timeline(stack, fallback.json()["id"])
    assert [(a["provider"], a["outcome"], a.get("next")) for a in timeline] == [
        ("gamma", failed_outcome(timeline[0]), "next_endpoint"),
        ("alpha", "ok", None),
    ]
    assert all(a["ms"] > 0 and a["model"] == "e2e/small" for a in timeline)


def failed_outcome(attempt: dict) -> str:
    assert attempt["outcome"] != "ok", attempt
    return str(attempt["outcome"])


def stored_timeline(stack: Stack, generation_id: str) -> list[dict]:
    """The attempts the ledger row of a request keeps, once Celery has flushed it."""

    def row() -> list:
        return stack.sql("select detail from gateway_generation where id = %s", generation_id)

    wait_until(lambda: bool(row()), timeout=15, what="the ledger row")
    [(detail,)] = row()
    detail = json.loads(detail) if isinstance(detail, str) else detail
    return list(detail["attempts"])


def test_it_plans_one_endpoint_when_allow_fallbacks_is_false(stack):
    response = chat(stack, body(provider={"allow_fallbacks": False}))

    served_by(response)
    assert route(response)["strategy"] == "routing_cost"
    assert "runner_up" not in route(response)


# --- filters: only, ignore, max_price, require_parameters ---------------------------------


def test_it_keeps_only_the_named_providers(stack):
    responses = serve_many(stack, body(provider={"only": ["gamma"]}))

    assert {served_by(r) for r in responses} == {"gamma"}
    assert refused(responses[0]) == {"alpha": "not_in_only", "beta": "not_in_only"}


def test_it_ignores_the_named_providers(stack):
    responses = serve_many(stack, body(provider={"ignore": ["alpha", "beta"]}))

    assert {served_by(r) for r in responses} == {"gamma"}
    assert refused(responses[0]) == {"alpha": "ignored", "beta": "ignored"}


def test_it_drops_endpoints_above_max_price(stack):
    prices = {e["provider"]: e["price"] for e in endpoints_of(LARGE)}
    completion_cap = 2.0  # USD per million output tokens
    prompt_cap = 0.4
    cheap_output = {p for p, price in prices.items() if price["output"] <= completion_cap}
    cheap_input = {p for p, price in prices.items() if price["input"] <= prompt_cap}
    assert len(cheap_output) == len(cheap_input) == 1 and cheap_output != cheap_input

    by_output = serve_many(stack, body(provider={"max_price": {"completion": completion_cap}}))
    by_input = serve_many(stack, body(provider={"max_price": {"prompt": prompt_cap}}))
    nothing = chat(stack, body(provider={"max_price": {"prompt": 0.01}}))

    assert {served_by(r) for r in by_output} == cheap_output
    assert set(refused(by_output[0]).values()) == {"max_price"}
    assert {served_by(r) for r in by_input} == cheap_input
    assert nothing.status_code == 400
    assert nothing.json()["error"]["code"] == "no_endpoint_available"
    assert "max_price" in nothing.json()["error"]["message"]


def test_it_requires_parameters_when_asked(stack):
    supporting = {e["provider"] for e in endpoints_of(LARGE) if "response_format" in e["supports"]}
    assert len(supporting) == 1
    request = body(response_format={"type": "json_object"})

    strict = serve_many(stack, {**request, "provider": {"require_parameters": True}}, n=8)

    assert {served_by(r) for r in strict} == supporting
    assert set(refused(strict[0]).values()) == {"unsupported:response_format"}


def test_it_sends_a_json_request_only_where_response_format_is_honoured(stack):
    supporting = {e["provider"] for e in endpoints_of(LARGE) if "response_format" in e["supports"]}

    json_mode = serve_many(stack, body(response_format={"type": "json_object"}), n=8)
    plain = chat(stack, body(response_format={"type": "text"}))

    assert {served_by(r) for r in json_mode} == supporting
    assert set(refused(json_mode[0]).values()) == {"no_response_format"}
    assert plain.status_code == 200 and "no_response_format" not in refused(plain).values()


# --- sorts and the suffixes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "input_tokens"),
    # The cheapest differs by model: chat-small's cheapest output is gamma's, chat-large's is
    # alpha's (a short prompt makes the output price decide).
    [(SMALL, 10), (LARGE, 10)],
)
def test_it_sorts_by_price(stack, model, input_tokens):
    cheapest = best(listed_prices(model, input_tokens))

    responses = serve_many(stack, body(model, provider={"sort": "price"}))

    assert {served_by(r) for r in responses} == {cheapest}
    assert route(responses[0])["strategy"] == "price"


def test_it_sorts_by_throughput(stack):
    fastest = best(throughputs(LARGE), highest=True)

    responses = serve_many(stack, body(provider={"sort": "throughput"}))

    assert {served_by(r) for r in responses} == {fastest}
    assert route(responses[0])["strategy"] == "throughput"


def generation(stack: Stack, generation_id: str) -> dict:
    """The tenant's record of a request (GET /v1/generation), once the ledger has stored it."""
    deadline = time.monotonic() + 20
    while True:
        record = httpx.get(
            f"{stack.base_url}/v1/generation",
            params={"id": generation_id},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=5,
        )
        if record.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert record.status_code == 200, record.text
    return record.json()["data"]


def stream(stack: Stack, request: dict) -> tuple[httpx.Response, list[dict]]:
    """A streamed request: the response (headers) and its JSON chunks."""
    with httpx.stream(
        "POST",
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={**request, "stream": True, "stream_options": {"include_usage": True}},
        timeout=30,
    ) as response:
        assert response.status_code == 200, response.read()
        chunks = [
            json.loads(line.removeprefix("data: "))
            for line in response.iter_lines()
            if line.startswith("data: {")
        ]
    return response, chunks


def test_it_measures_time_to_first_token_at_the_first_token(stack):
    ttft = {p: first for p, (first, _) in speeds(LARGE).items()}
    for provider in ttft:
        _, chunks = stream(stack, body(provider={"only": [provider]}))
        record = generation(stack, chunks[0]["id"])

        assert record["provider_name"] == provider
        # The simulator waits its TTFT before the first token; the gateway only adds to it.
        assert record["time_to_first_token"] >= 0.9 * ttft[provider] * 1000


def test_it_sorts_by_latency(stack):
    first_token = {p: ttft for p, (ttft, _) in speeds(LARGE).items()}
    quickest = best(first_token)

    answers = [stream(stack, body(provider={"sort": "latency"})) for _ in range(6)]

    assert {r.headers["x-switchyard-provider"] for r, _ in answers} == {quickest}
    assert route(answers[0][0])["strategy"] == "latency"
    # The winner must be the quickest by the time it really took to its first token.
    record = generation(stack, answers[0][1][0]["id"])
    assert record["time_to_first_token"] >= 0.9 * first_token[quickest] * 1000


def test_it_sorts_by_price_for_the_floor_suffix(stack):
    cheapest = best(listed_prices(SMALL, 10))

    responses = serve_many(stack, body(f"{SMALL}:floor"))

    assert {served_by(r) for r in responses} == {cheapest}
    assert route(responses[0])["strategy"] == "price"
    assert {r.json()["model"] for r in responses} == {SMALL}


def test_it_sorts_by_throughput_for_the_nitro_suffix(stack):
    fastest = best(throughputs(LARGE), highest=True)

    responses = serve_many(stack, body(f"{LARGE}:nitro"))

    assert {served_by(r) for r in responses} == {fastest}
    assert route(responses[0])["strategy"] == "throughput"


# --- preferences: deprioritise, never exclude ---------------------------------------------


def test_it_puts_endpoints_below_preferred_min_throughput_last(stack):
    rates = throughputs(LARGE)
    cheapest = best(listed_prices(LARGE, 10))
    fastest = best(rates, highest=True)
    assert cheapest != fastest
    # Between the fastest endpoint and the next: only the fastest is fast enough.
    threshold = geometric_mean(rates[fastest], rates[second(rates, highest=True)])

    responses = serve_many(
        stack, body(provider={"sort": "price", "preferred_min_throughput": threshold})
    )

    assert {served_by(r) for r in responses} == {fastest}
    assert route(responses[0])["runner_up"] == cheapest  # demoted, still a fallback
    assert set(refused(responses[0]).values()) == {"below_min_throughput"}


def test_it_puts_endpoints_above_preferred_max_latency_last(stack):
    first_token = {p: ttft for p, (ttft, _) in speeds(LARGE).items()}
    cheapest = best(listed_prices(LARGE, 10))
    quickest = best(first_token)
    assert cheapest != quickest
    threshold = geometric_mean(first_token[quickest], first_token[second(first_token)])

    # OpenRouter's percentile form: the p50 is compared with the measured TTFT.
    responses = serve_many(
        stack, body(provider={"sort": "price", "preferred_max_latency": {"p50": threshold}})
    )

    assert {served_by(r) for r in responses} == {quickest}
    assert route(responses[0])["runner_up"] == cheapest
    assert set(refused(responses[0]).values()) == {"above_max_latency"}


# --- the models fallback list -------------------------------------------------------------


def test_it_falls_back_to_the_next_model_when_the_first_is_unavailable(stack):
    response = chat(stack, body("e2e/down", models=[SMALL]))

    assert served_by(response) in {e["provider"] for e in endpoints_of(SMALL)}
    assert response.json()["model"] == SMALL
    assert response.headers["x-switchyard-attempts"] == "2"


def test_it_serves_the_first_model_when_it_is_available(stack):
    response = chat(stack, body(SMALL, models=[LARGE]))

    served_by(response)
    assert response.json()["model"] == SMALL


# --- a tenant's default sort --------------------------------------------------------------


def _tenant_sort(stack: Stack, sort: str) -> None:
    stack.manage(
        "shell",
        "-c",
        "from tenants.models import Tenant; from common.redis import config_version_bump; "
        f"Tenant.objects.filter(name='acme').update(default_sort={sort!r}); "
        "config_version_bump()",
    )
    wanted = sort or "routing_cost"
    deadline = time.monotonic() + 10
    while route(chat(stack, body(SMALL)))["strategy"] != wanted:
        assert time.monotonic() < deadline, "the gateway did not reload the tenant's sort"
        time.sleep(0.1)


def test_it_uses_the_tenant_default_sort_unless_the_request_says_otherwise(stack):
    cheapest = best(listed_prices(SMALL, 10))
    _tenant_sort(stack, "price")
    try:
        plain = serve_many(stack, body(SMALL))
        sorted_by_request = chat(stack, body(SMALL, provider={"sort": "throughput"}))
        suffixed = chat(stack, body(f"{LARGE}:nitro"))
        other_tenant = chat(stack, body(SMALL), key=GLOBEX_KEY)
    finally:
        _tenant_sort(stack, "")

    assert {served_by(r) for r in plain} == {cheapest}
    assert {route(r)["strategy"] for r in plain} == {"price"}
    assert route(sorted_by_request)["strategy"] == "throughput"
    assert route(suffixed)["strategy"] == "throughput"
    assert route(other_tenant)["strategy"] == "routing_cost"


# --- bad values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "provider",
    [
        {"sort": "fastest"},
        {"only": "alpha"},
        {"ignore": [1, 2]},
        {"order": "alpha"},
        {"allow_fallbacks": "no"},
        {"require_parameters": 1},
        {"max_price": {"prompt": -1}},
        {"max_price": "cheap"},
        {"sort": {"by": "price", "partition": "sometimes"}},
        {"preferred_max_latency": {"p42": 1}},
        {"max_cost_premium": -0.01},
        {"max_cost_premium": "6%"},
        {"max_cost_premium": True},
        "alpha",
    ],
    ids=repr,
)
def test_it_refuses_bad_provider_preferences(stack, provider):
    response = chat(stack, body(provider=provider))

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "provider"
    assert error["type"] == "invalid_request_error"
    assert error["message"]


# --- G15: who served, at what cost, and why -----------------------------------------------


def _cost(price: dict, usage: dict) -> float:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return (
        (usage["prompt_tokens"] - cached) * price["input"]
        + cached * price.get("cached_input", price["input"])
        + usage["completion_tokens"] * price["output"]
    ) / 1_000_000


@pytest.mark.parametrize("provider", ["alpha", "beta", "gamma"])
def test_it_explains_and_prices_the_answer_and_records_who_served(stack, provider):
    prices = {e["provider"]: e["price"] for e in endpoints_of(LARGE)}
    # A long prompt, so cached input (priced apart) shows up where the provider caches.
    long = [{"role": "user", "content": "Summarise this. " + "lorem ipsum dolor " * 600}]
    response = chat(stack, {**body(), "messages": long, "provider": {"only": [provider]}})

    assert served_by(response) == provider
    explanation = route(response)
    assert explanation["strategy"] == "routing_cost" and explanation["winner"] == provider
    usage = response.json()["usage"]
    assert usage["cost"] == pytest.approx(_cost(prices[provider], usage), rel=1e-6, abs=1e-10)

    data = generation(stack, response.json()["id"])
    assert (data["provider_name"], data["model"]) == (provider, LARGE)
    assert data["total_cost"] == pytest.approx(usage["cost"], rel=1e-6)


def test_it_prices_a_streamed_answer_from_the_provider_that_served_it(stack):
    prices = {e["provider"]: e["price"] for e in endpoints_of(LARGE)}

    response, chunks = stream(stack, body())

    provider = response.headers["x-switchyard-provider"]
    assert route(response)["strategy"] == "routing_cost"
    assert {c["provider"] for c in chunks} == {provider}
    usage = chunks[-1]["usage"]
    assert usage["cost"] == pytest.approx(_cost(prices[provider], usage), rel=1e-6, abs=1e-10)


# --- the cost guard (issue 17) ----------------------------------------------------------


def guard_bound(response: httpx.Response) -> tuple[float, float] | None:
    """The route header's ``cost_guard=bound(+a%->+b%)`` as (a, b) in percent; None: absent."""
    value = route(response).get("cost_guard")
    if value is None:
        return None
    assert value.startswith("bound(") and value.endswith("%)"), value
    before, _, after = value.removeprefix("bound(").removesuffix(")").partition("->")
    return float(before.removesuffix("%")), float(after.removesuffix("%"))


def test_it_says_in_the_route_header_when_the_cost_guard_bound_the_choice(stack):
    # A short chat-large request's effective prices: alpha's is the lowest (its output is the
    # cheapest and the answer is mostly output), beta's 1.6 times it and 0.2 s faster, so the
    # routing cost gives beta a share worth paying for. At provider.max_cost_premium 0 the
    # guard takes all but beta's and gamma's floors back to alpha, and says so.
    prices = listed_prices(LARGE, 10)
    assert best(prices) == "alpha"
    bound = chat(stack, body(provider={"max_cost_premium": 0}))
    assert bound.status_code == 200, bound.text
    before, after = guard_bound(bound)
    floors = 0.01 * (prices["beta"] / prices["alpha"] - 1) + 0.01 * (
        prices["gamma"] / prices["alpha"] - 1
    )
    assert before > after >= 0.0
    assert after <= 100 * floors * 1.5  # only the floors stay above the bound (cache aside)

    loose = chat(stack, body(provider={"max_cost_premium": 10}))
    assert loose.status_code == 200, loose.text
    assert guard_bound(loose) is None and "cost_guard" not in loose.headers["x-switchyard-route"]
