"""Behind a reverse proxy that terminates TLS (issue 14, README "Behind a reverse proxy").

The proxy talks plain HTTP to the gateway and says what the caller used in X-Forwarded-Proto,
X-Forwarded-For and Host. These tests send exactly what such a proxy on the same host sends
(uvicorn trusts the forwarded headers of FORWARDED_ALLOW_IPS, 127.0.0.1 by default).
"""

import os

import httpx
import pytest

from tests.stack import Stack

pytestmark = pytest.mark.e2e

PUBLIC = "gateway.example.test"
FORWARDED = {"Host": PUBLIC, "X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}


@pytest.fixture(scope="module")
def proxied_stack():
    stack = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        celery=False,
        extra_env={"ALLOWED_HOSTS": PUBLIC, "SECURE_COOKIES": "1"},
    )
    try:
        yield stack.start()
    finally:
        stack.stop()


def _cookie(response: httpx.Response, name: str) -> str:
    [header] = [h for h in response.headers.get_list("set-cookie") if h.startswith(f"{name}=")]
    return header


def test_the_admin_signs_in_over_https_at_the_proxy_with_cookies_kept_off_plain_http(
    proxied_stack,
):
    password = proxied_stack.manage("demo_admin").strip()
    with httpx.Client(base_url=proxied_stack.base_url, timeout=30) as client:
        page = client.get("/admin/login/", headers=FORWARDED)
        csrf = _cookie(page, "csrftoken")
        assert page.status_code == 200 and "; Secure" in csrf
        token = csrf.split(";")[0].split("=", 1)[1]
        signed_in = client.post(
            "/admin/login/?next=/admin/",
            data={"username": "admin", "password": password, "csrfmiddlewaretoken": token},
            headers={**FORWARDED, "Origin": f"https://{PUBLIC}", "Cookie": f"csrftoken={token}"},
        )
        assert signed_in.status_code == 302, signed_in.text[:500]
        assert signed_in.headers["location"] == "/admin/"
        assert "; Secure" in _cookie(signed_in, "sessionid")


def test_a_form_posted_from_plain_http_is_refused_when_the_site_is_https(proxied_stack):
    """The scheme comes from the proxy's header: an http:// origin is not the site's own."""
    with httpx.Client(base_url=proxied_stack.base_url, timeout=30) as client:
        page = client.get("/admin/login/", headers=FORWARDED)
        token = _cookie(page, "csrftoken").split(";")[0].split("=", 1)[1]
        refused = client.post(
            "/admin/login/",
            data={"username": "admin", "password": "x", "csrfmiddlewaretoken": token},
            headers={**FORWARDED, "Origin": f"http://{PUBLIC}", "Cookie": f"csrftoken={token}"},
        )
    assert refused.status_code == 403


def test_the_admin_refuses_a_host_it_does_not_serve(proxied_stack):
    answer = httpx.get(
        f"{proxied_stack.base_url}/admin/login/",
        headers={**FORWARDED, "Host": "evil.example.test"},
        timeout=30,
    )
    assert answer.status_code == 400


def test_the_proxy_api_streams_through_unbuffered(proxied_stack):
    """A proxy must not hold server-sent events back: the gateway says so to nginx."""
    with httpx.stream(
        "POST",
        f"{proxied_stack.base_url}/v1/chat/completions",
        headers={**FORWARDED, "Authorization": "Bearer sk-sy-test-acme-web-0001"},
        json={
            "model": "acme/chat-large",
            "stream": True,
            "messages": [{"role": "user", "content": "Hello!"}],
        },
        timeout=30,
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["x-accel-buffering"] == "no"
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert any(line.startswith("data: ") for line in answer.iter_lines())
