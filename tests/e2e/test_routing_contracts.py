"""Fallback contracts end to end (SPEC F5, issue 18 item 3).

"A fallback outside the route's contract (region, price ceiling) is never tried; the refusal
names the clause." The gateway under uvicorn, the provider simulator over HTTP on the quiet
reference market: alpha (the first choice, by the client's ``provider.order``) has an incident
that fails every call of its upstream model, and the routes' other endpoints are beta (region
eu, 1.6x alpha's prices) and, on one route, gamma (region us). The simulator's own counters
(``GET /_stats``) show which endpoints were called.
"""

from __future__ import annotations

import os

import pytest

from tests.e2e.routing_support import (
    chat,
    endpoints_of,
    incident,
    incident_wait_over,
    quiet_market,
    routing_config,
    sim_delta,
    sim_requests,
)
from tests.stack import Stack, free_port

pytestmark = pytest.mark.e2e

ALPHA, BETA, GAMMA = endpoints_of("acme/chat-large")  # beta: 1.6x alpha's prices
REGIONS = {"alpha": "us", "beta": "eu", "gamma": "us"}


def route(slug: str, contract: dict, *endpoints: dict) -> dict:
    return {
        "slug": slug,
        "fallback_contract": contract,
        "endpoints": [{**e, "region": REGIONS[e["provider"]]} for e in endpoints],
    }


RESIDENT = route("e2e/resident", {"regions": "same"}, ALPHA, BETA)
RESIDENT_WIDE = route("e2e/resident-wide", {"regions": "same"}, ALPHA, BETA, GAMMA)
CEILING = route("e2e/ceiling", {"max_price_ratio": 1.2}, ALPHA, BETA)
OPEN = route("e2e/open", {}, ALPHA, BETA)


# A workload class whose requests must stay in the first choice's region, whatever the route
# allows; lighter than the app's own class, so a request may name it (x-switchyard-workload).
RESIDENT_CLASS = {
    "name": "resident",
    "deadline": "10s",
    "max_queue_depth": 100,
    "overload": "reject",
    "weight": 4,
    "fallback_contract": {"regions": "same"},
}


def with_resident_class(edit):
    def both(config: dict) -> None:
        edit(config)
        config["workload_classes"].append(RESIDENT_CLASS)

    return both


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        market=quiet_market(tmp_path_factory.mktemp("market")),
        latency_scale=0.1,
        config_edit=with_resident_class(
            routing_config(free_port(), [RESIDENT, RESIDENT_WIDE, CEILING, OPEN])
        ),
    )
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture
def alpha_down(stack):
    """Every call of alpha's chat-large fails (a 5xx) while the test runs."""
    ends = incident(stack, "alpha", model="chat-large", **{"for": "6s"}, error_rate=1.0)
    yield
    incident_wait_over(stack, "alpha", ends)


def ask(stack: Stack, model: str, workload: str | None = None):
    before = sim_requests(stack)
    response = chat(
        stack,
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say something short."}],
            "max_tokens": 20,
            "provider": {"order": ["alpha"]},
        },
        headers={"x-switchyard-workload": workload} if workload else None,
    )
    return response, sim_delta(before, sim_requests(stack))


def test_a_fallback_in_another_region_is_never_tried_and_the_refusal_names_it(stack, alpha_down):
    response, calls = ask(stack, "e2e/resident")

    assert response.status_code >= 500, response.text
    assert ("beta", "chat-large-fast") not in calls, calls  # the out-of-contract endpoint
    assert calls.get(("alpha", "chat-large"), 0) >= 1, calls  # the first choice was tried
    error = response.json()["error"]
    assert (
        "Fallback to 'e2e/resident@beta' not allowed by the route's contract (e2e/resident): "
        "region eu != us" in error["message"]
    ), error
    assert error["reason"].endswith(":fallback_contract")
    assert response.headers["x-switchyard-reason"] == error["reason"]
    assert "e2e/resident@beta:contract(region eu != us)" in response.headers["x-switchyard-route"]


def test_a_fallback_above_the_price_ceiling_is_never_tried_and_the_refusal_names_it(
    stack, alpha_down
):
    response, calls = ask(stack, "e2e/ceiling")

    assert response.status_code >= 500, response.text
    assert ("beta", "chat-large-fast") not in calls, calls
    assert calls.get(("alpha", "chat-large"), 0) >= 1, calls
    message = response.json()["error"]["message"]
    assert "Fallback to 'e2e/ceiling@beta' not allowed" in message, message
    assert "price ratio 1.6 > 1.2" in message, message


def test_a_fallback_inside_the_contract_serves_while_the_one_outside_is_skipped(stack, alpha_down):
    response, calls = ask(stack, "e2e/resident-wide")

    assert response.status_code == 200, response.text
    assert response.headers["x-switchyard-provider"] == "gamma"
    assert ("beta", "chat-large-fast") not in calls, calls
    assert calls.get(("gamma", "chat-large")) == 1, calls
    assert (
        "e2e/resident-wide@beta:contract(region eu != us)"
        in (response.headers["x-switchyard-route"])
    )


def test_without_a_contract_the_same_fallback_serves(stack, alpha_down):
    # The control: the very endpoint the contracts stopped is reachable and healthy.
    response, calls = ask(stack, "e2e/open")

    assert response.status_code == 200, response.text
    assert response.headers["x-switchyard-provider"] == "beta"
    assert calls.get(("beta", "chat-large-fast")) == 1, calls


def test_a_workload_class_contract_narrows_an_open_route_and_the_refusal_names_the_class(
    stack, alpha_down
):
    response, calls = ask(stack, "e2e/open", workload="resident")

    assert response.status_code >= 500, response.text
    assert ("beta", "chat-large-fast") not in calls, calls  # open route, resident class
    assert calls.get(("alpha", "chat-large"), 0) >= 1, calls
    error = response.json()["error"]
    assert (
        "Fallback to 'e2e/open@beta' not allowed by the route's contract "
        "(e2e/open, class resident): region eu != us" in error["message"]
    ), error
    assert error["reason"].endswith(":fallback_contract")
