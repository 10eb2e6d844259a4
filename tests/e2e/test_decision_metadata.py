"""Decision metadata on every response (H1): the caller's own limits, never anyone else's."""

import httpx
import pytest

pytestmark = pytest.mark.e2e

ACME = "sk-sy-test-acme-web-0001"
GLOBEX = "sk-sy-test-globex-0001"


def post(stack, key, **extra):
    return httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "acme/chat-small", "messages": [{"role": "user", "content": "hi"}], **extra},
        timeout=30,
    )


def test_it_describes_the_callers_limits_in_standard_headers(stack):
    response = post(stack, GLOBEX, max_tokens=20)
    assert response.status_code == 200
    headers = response.headers

    assert headers["RateLimit-Policy"] == '"tenant:globex:requests:1m";q=120;w=60;qu="requests"'
    name, remaining, reset = headers["RateLimit"].split(";")
    assert name == '"tenant:globex:requests:1m"'
    assert 0 <= int(remaining.removeprefix("r=")) < 120
    assert int(reset.removeprefix("t=")) >= 0
    assert headers["x-ratelimit-limit-requests"] == "120"
    assert int(headers["x-ratelimit-remaining-requests"]) == int(remaining.removeprefix("r="))
    assert headers["x-ratelimit-reset-requests"].endswith(("ms", "s"))
    assert headers["x-switchyard-workload"] == "partner"
    assert headers["x-switchyard-attempts"] == "1"
    assert headers["x-switchyard-reason"] == "ok"
    assert headers["x-switchyard-bucket"] == "tenant:globex:requests:1m"


def test_it_reports_token_limits_and_the_tightest_bucket(stack):
    response = post(stack, ACME, max_tokens=50)
    assert response.status_code == 200
    headers = response.headers
    policies = headers["RateLimit-Policy"]
    assert '"app:acme/search/web:concurrency";q=20;qu="concurrent-requests"' in policies
    assert '"tenant:acme:total_tokens:day";q=5000000;w=86400;sy-unit="total_tokens"' in policies
    assert '"tenant:acme:spend:rolling-5h";q=50;w=18000;sy-unit="spend"' in policies
    assert headers["x-ratelimit-limit-tokens"] == "5000000"
    assert int(headers["x-ratelimit-remaining-tokens"]) < 5000000
    assert "x-ratelimit-limit-requests" not in headers  # acme has no request limit


def test_it_never_shows_another_tenant_or_a_provider_secret(stack):
    response = post(stack, ACME)
    exposed = " ".join(f"{k}: {v}" for k, v in response.headers.items()) + response.text
    assert "globex" not in exposed and "resellerco" not in exposed
    assert "sim-alpha" not in exposed and "ALPHA_API_KEY" not in exposed


@pytest.mark.parametrize(
    ("asked", "status", "reason"),
    [("no-such-class", 400, "unknown_workload"), ("interactive", 403, "workload_not_allowed")],
)
def test_it_names_the_apps_own_class_when_it_refuses_the_one_asked(stack, asked, status, reason):
    # globex's app is a partner app (weight 4): interactive (8) is heavier, and refused.
    response = httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {GLOBEX}", "X-Switchyard-Workload": asked},
        json={"model": "acme/chat-small", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert response.status_code == status
    assert response.headers["x-switchyard-reason"] == reason
    assert response.headers["x-switchyard-workload"] == "partner"
