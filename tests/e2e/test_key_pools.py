"""Provider-side scopes and key pools end to end (SPEC B2, D1; issue 18 items 1 and 2).

A real gateway, Redis, PostgreSQL and the provider simulator over HTTP. The simulator knows
each provider organisation's keys, enforces every key's own limits and the organisation's,
describes a key's limits in that key's rate-limit headers, and counts what each key received
(``GET /_stats`` → ``keys``); ``POST /_keys/revoke`` makes it answer one key with 401.

- ``orgsim``: five keys under one organisation; the organisation's input-token limit is
  shared, each key has its own (different) request limit. A burst from all five never makes
  the simulator refuse (it never sees more than either limit), and it reaches every key.
- ``hdrsim``: the key ``tight`` has a tighter request limit at the provider than the gateway
  was told; its headers tighten that key's bucket only, never ``loose``'s nor the
  organisation's.
- ``authsim``: three keys; one is revoked at the provider. The first request sent with it is
  retried on another key and served; no later request goes to it.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.brokerstate import allowances_over, bucket_available
from tests.stack import Stack

pytestmark = pytest.mark.e2e

CALLER = "sk-sy-test-pools-0000000001"
MODEL_SPEC = {"ttft_ms": {"median": 40, "p95": 40}, "tokens_per_s": {"median": 400, "p05": 400}}
# orgsim: the shared organisation limit and each key's own request limit (per minute).
ORG_INPUT_TPM = 6000
KEY_RPM = {"k1": 3, "k2": 4, "k3": 6, "k4": 8, "k5": 12}
# The gateway's input estimate (about 4 characters a token, C2) is above what the simulator
# counts for this prompt (180 + overheads), as a calibrated estimate should be: a prompt it
# undercounts would reach the provider's token limit before the broker's, and that is C11's
# concern (corrections learnt over many requests), not the pools'.
PROMPT = "consolidated " * 60
HDR_TIGHT_RPM = 8  # at the provider; the gateway's bucket for the key says 100
AUTH_KEYS = ("a1", "a2", "a3")


def secret(provider: str, key: str) -> str:
    return f"sim-{provider}-{key}-secret"


def variable(provider: str, key: str) -> str:
    return f"POOL_{provider.upper()}_{key.upper()}"


def market(directory: Path) -> Path:
    def provider(name: str, limits: dict, keys: list[dict]) -> dict:
        return {
            "name": name,
            "port": 0,
            "protocol": "openai",
            "limits": limits,
            "keys": keys,
            "models": {"chat": MODEL_SPEC},
        }

    data = {
        "providers": [
            provider(
                "orgsim",
                {"input_tokens_per_minute": ORG_INPUT_TPM},
                [
                    {"name": k, "key": secret("orgsim", k), "limits": {"requests_per_minute": n}}
                    for k, n in KEY_RPM.items()
                ],
            ),
            provider(
                "hdrsim",
                {"requests_per_minute": 1000},
                [
                    {
                        "name": "tight",
                        "key": secret("hdrsim", "tight"),
                        "limits": {"requests_per_minute": HDR_TIGHT_RPM},
                    },
                    {"name": "loose", "key": secret("hdrsim", "loose")},
                ],
            ),
            provider(
                "authsim",
                {"requests_per_minute": 1000},
                [{"name": k, "key": secret("authsim", k)} for k in AUTH_KEYS],
            ),
        ]
    }
    path = directory / "pools-market.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def config(directory: Path) -> Path:
    def endpoint(provider: str) -> dict:
        return {
            "provider": provider,
            "upstream_model": "chat",
            "price": {"input": 0.1, "output": 0.2},
            "context_window": 32768,
            "max_output": 512,
        }

    def key(provider: str, name: str, limits: list[dict]) -> dict:
        return {"name": name, "api_key_env": variable(provider, name), "limits": limits}

    data = {
        "providers": [
            {
                "name": "orgsim",
                "protocol": "openai",
                "base_url": "http://127.0.0.1:1/v1",
                "learn_concurrency": False,
                "limits": [{"dimension": "input_tokens", "capacity": ORG_INPUT_TPM, "per": "1m"}],
                "keys": [
                    key("orgsim", k, [{"dimension": "requests", "capacity": n, "per": "1m"}])
                    for k, n in KEY_RPM.items()
                ],
            },
            {
                "name": "hdrsim",
                "protocol": "openai",
                "base_url": "http://127.0.0.1:1/v1",
                "learn_concurrency": False,
                "limits": [{"dimension": "requests", "capacity": 1000, "per": "1m"}],
                "keys": [
                    key("hdrsim", k, [{"dimension": "requests", "capacity": 100, "per": "1m"}])
                    for k in ("tight", "loose")
                ],
            },
            {
                "name": "authsim",
                "protocol": "openai",
                "base_url": "http://127.0.0.1:1/v1",
                "learn_concurrency": False,
                "keys": [key("authsim", k, []) for k in AUTH_KEYS],
            },
        ],
        "models": [
            {"slug": "pools/burst", "endpoints": [endpoint("orgsim")]},
            {"slug": "pools/headers", "endpoints": [endpoint("hdrsim")]},
            {"slug": "pools/auth", "endpoints": [endpoint("authsim")]},
        ],
        "workload_classes": [
            {
                "name": "interactive",
                "deadline": "3s",
                "max_queue_depth": 200,
                "overload": "reject",
                "retry_budget": 2,
            }
        ],
        "tenants": [
            {
                "name": "pools",
                "teams": [
                    {
                        "name": "t",
                        "apps": [
                            {
                                "name": "a",
                                "default_workload": "interactive",
                                "keys": [{"name": "ci", "secret": CALLER}],
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = directory / "pools.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pools")
    secrets = {variable("orgsim", k): secret("orgsim", k) for k in KEY_RPM}
    secrets |= {variable("hdrsim", k): secret("hdrsim", k) for k in ("tight", "loose")}
    secrets |= {variable("authsim", k): secret("authsim", k) for k in AUTH_KEYS}
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        market=market(directory),
        config=config(directory),
        latency_scale=0.1,
        celery=False,
        extra_env=secrets,
    )
    try:
        yield running.start()
    finally:
        running.stop()


def chat(stack: Stack, model: str, client: httpx.Client, max_tokens: int = 8) -> httpx.Response:
    return client.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"authorization": f"Bearer {CALLER}"},
        json={
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
        },
        timeout=30,
    )


def sim_stats(stack: Stack, provider: str) -> dict:
    return httpx.get(f"{stack.sim_url(provider)}/_stats", timeout=5).json()


def test_a_burst_over_five_keys_never_exceeds_a_key_or_the_organisation_at_the_provider(stack):
    started = time.monotonic()
    with (
        httpx.Client() as client,
        concurrent.futures.ThreadPoolExecutor(max_workers=40) as pool,
    ):
        answers = list(pool.map(lambda _: chat(stack, "pools/burst", client), range(80)))
    elapsed = time.monotonic() - started
    statuses = [a.status_code for a in answers]
    stats = sim_stats(stack, "orgsim")
    keys = stats["keys"]
    print("burst: statuses", {s: statuses.count(s) for s in set(statuses)}, "in", elapsed)
    print("burst: simulator per key", keys, "org input tokens", stats["input_tokens"])

    # The provider refused nothing: no key's limit and not the organisation's was exceeded.
    assert stats["rate_limited"] == {}
    assert all(k["rate_limited"] == 0 and k["unauthorized"] == 0 for k in keys.values())
    # What each key received stays within its own limit (plus what refilled meanwhile) …
    for name, rpm in KEY_RPM.items():
        assert keys[name]["admitted"] <= rpm + rpm * elapsed / 60 + 1e-9, (name, keys[name])
    # … what the organisation received within its shared one; and the limits did bind:
    assert stats["input_tokens"] <= ORG_INPUT_TPM * (1 + elapsed / 60)
    served = statuses.count(200)
    assert 0 < served < 80 and set(statuses) <= {200, 429}
    assert sum(k["admitted"] for k in keys.values()) == served
    # Spread, not first-fit: every key served some of the burst.
    assert all(keys[name]["admitted"] > 0 for name in KEY_RPM), keys
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.json()["error"]["message"].startswith("No capacity for this request")


def test_a_keys_own_headers_tighten_that_keys_bucket_only(stack):
    with httpx.Client() as client:
        answers = [chat(stack, "pools/headers", client) for _ in range(30)]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    keys = sim_stats(stack, "hdrsim")["keys"]
    print("headers: simulator per key", keys)
    tight_sent, loose_sent = keys["tight"]["admitted"], keys["loose"]["admitted"]
    assert keys["tight"]["rate_limited"] == 0  # tightened before the provider had to refuse
    time.sleep(0.5)  # the observation is written off the response path
    tight = bucket_available(stack, "credential:hdrsim/tight:requests:1m")  # before it refills
    allowances_over(stack)  # what they held unused is back in the others
    loose = bucket_available(stack, "credential:hdrsim/loose:requests:1m")
    organisation = bucket_available(stack, "provider:hdrsim:requests:1m")
    print("headers: levels tight", tight, "loose", loose, "organisation", organisation)
    # The tight key's bucket follows the provider's word (8 a minute, nearly spent; it then
    # refills towards its configured 100 by the provider's reset time): without the headers
    # it would hold about 100 - 1 - sent …
    assert tight_sent >= HDR_TIGHT_RPM * 0.75
    assert tight <= 4
    # … while its headers changed neither the other key's bucket nor the organisation's.
    assert loose >= 100 - 1 - loose_sent - 1
    assert organisation >= 1000 - 17 - len(answers)
    assert loose_sent + tight_sent == len(answers)


def test_a_revoked_key_leaves_the_pool_within_one_request_and_the_others_serve(stack):
    revoked = httpx.post(f"{stack.sim_url('authsim')}/_keys/revoke", json={"name": "a2"})
    assert revoked.status_code == 200
    with httpx.Client() as client:
        answers = [chat(stack, "pools/auth", client) for _ in range(24)]
    assert [a.status_code for a in answers] == [200] * 24, [a.text for a in answers]
    keys = sim_stats(stack, "authsim")["keys"]
    print("auth: simulator per key", keys)
    # The revoked key was tried once (one request found it out, and was retried on another
    # key: a third of the requests would go to it otherwise); every other request went to the
    # two keys left.
    assert keys["a2"]["unauthorized"] == 1
    assert keys["a2"]["admitted"] == 0
    assert keys["a1"]["admitted"] + keys["a3"]["admitted"] == 24
    assert keys["a1"]["admitted"] > 0 and keys["a3"]["admitted"] > 0
    retried = [a for a in answers if int(a.headers["x-switchyard-attempts"]) > 1]
    assert len(retried) == keys.get("a2", {}).get("unauthorized", 0)
