"""What the routing end-to-end tests share: a quiet market, the test config, small HTTP helpers.

The override and stickiness tests assert where single requests go, so they run on a market
whose providers never fail at random and whose speeds do not vary (the reference market's
medians, with p95 = p05 = median): a 1 % random 500 would otherwise send a request to the
next endpoint now and then and make an exact assertion flaky. The incident test keeps the
reference market as it is.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.stack import REFERENCE_CONFIG, REFERENCE_MARKET, Stack

KEY = "sk-sy-test-acme-web-0001"
GLOBEX_KEY = "sk-sy-test-globex-0001"
PROVIDERS = ("alpha", "beta", "gamma")
RATES = ("error_rate", "overload_rate", "malformed_tool_call_rate")


def reference_config() -> dict[str, Any]:
    return yaml.safe_load(REFERENCE_CONFIG.read_text())


def reference_market() -> dict[str, Any]:
    return yaml.safe_load(REFERENCE_MARKET.read_text())


def quiet_market(directory: Path) -> Path:
    """The reference market without random failures and with constant speeds (the medians)."""
    market = reference_market()
    for provider in market["providers"]:
        provider.pop("incidents", None)
        for spec in provider["models"].values():
            spec["ttft_ms"]["p95"] = spec["ttft_ms"]["median"]
            spec["tokens_per_s"]["p05"] = spec["tokens_per_s"]["median"]
            for rate in RATES:
                spec.pop(rate, None)
    path = directory / "quiet-market.yaml"
    path.write_text(yaml.safe_dump(market, sort_keys=False))
    return path


def endpoints_of(slug: str) -> list[dict[str, Any]]:
    """The reference config's endpoints of a model (prices, upstream model, supports)."""
    [model] = [m for m in reference_config()["models"] if m["slug"] == slug]
    return model["endpoints"]


def routing_config(closed_port: int, extra_models: list[dict[str, Any]] = ()):
    """The reference config for the routing tests (config_edit for ``Stack``).

    Beta's ramp limit goes: it lets a provider's traffic at most double per minute from 20
    requests, so in a fresh stack beta could serve only a handful of requests in the first
    minute whatever the router decides — that is the broker's ramp, tested elsewhere, and here
    it would hide the router's choices. ``e2e/down`` is served only by a closed port, for the
    ``models`` fallback list.
    """

    def edit(config: dict[str, Any]) -> None:
        for provider in config["providers"]:
            provider["limits"] = [
                limit for limit in provider.get("limits", []) if limit["dimension"] != "ramp"
            ]
        config["providers"].append(
            {
                "name": "unreachable",
                "protocol": "openai",
                "base_url": f"http://127.0.0.1:{closed_port}/v1",
            }
        )
        small = endpoints_of("acme/chat-small")[0]
        config["models"].append(
            {
                "slug": "e2e/down",
                "endpoints": [{**small, "provider": "unreachable"}],
            }
        )
        config["models"] += list(extra_models)

    return edit


def chat(
    stack: Stack,
    body: dict[str, Any],
    *,
    key: str = KEY,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> httpx.Response:
    return httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", **(headers or {})},
        json=body,
        timeout=timeout,
    )


def route(response: httpx.Response) -> dict[str, str]:
    """The G15 explanation header as a dict: strategy, winner, runner_up, sticky, refused."""
    header = response.headers["x-switchyard-route"]
    fields = {}
    for part in header.split("; "):
        name, _, value = part.partition("=")
        fields[name] = value.split(" ")[0]  # "alpha cost=0.0001" → "alpha"
    return fields


def served_by(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    provider = response.headers["x-switchyard-provider"]
    assert response.json()["provider"] == provider
    return provider


def sim_requests(stack: Stack) -> dict[tuple[str, str], int]:
    """Requests each simulated provider received, by (provider, upstream model)."""
    counts = {}
    for provider in PROVIDERS:
        stats = httpx.get(f"{stack.sim_url(provider)}/_stats", timeout=5).json()
        for model, counters in stats["models"].items():
            counts[provider, model] = counters["requests"]
    return counts


def sim_delta(before: dict, after: dict) -> dict[tuple[str, str], int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def incident(stack: Stack, provider: str, **fields: Any) -> float:
    """Start an incident at a simulated provider; returns when it ends (time.time())."""
    response = httpx.post(f"{stack.sim_url(provider)}/_incident", json=fields, timeout=5)
    assert response.status_code == 200, response.text
    return float(response.json()["ends_at"])


def incident_wait_over(stack: Stack, provider: str, ends_at: float) -> None:
    """Block until the provider has no active incident, so the next test sees a healthy market."""
    time.sleep(max(0.0, ends_at - time.time()))
    deadline = time.monotonic() + 10
    while httpx.get(f"{stack.sim_url(provider)}/_stats", timeout=5).json()["incidents"]:
        assert time.monotonic() < deadline, "the incident did not end"
        time.sleep(0.1)


def e2e_throughput(ttft_s: float, tokens_per_s: float, output_tokens: float) -> float:
    """End-to-end output tokens per second of one answer (the router's G4 throughput)."""
    return output_tokens / (ttft_s + output_tokens / tokens_per_s)


def geometric_mean(a: float, b: float) -> float:
    return math.sqrt(a * b)
