"""Operator metrics (H2): Prometheus text at /metrics, for staff only."""

import httpx
import pytest

pytestmark = pytest.mark.e2e


def staff_client(stack) -> httpx.Client:
    password = stack.manage("demo_admin").strip()
    client = httpx.Client(base_url=stack.base_url, timeout=30)
    client.get("/admin/login/")
    client.post(
        "/admin/login/?next=/admin/",
        data={
            "username": "admin",
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Referer": f"{stack.base_url}/admin/login/"},
    )
    return client


def test_it_shows_metrics_to_staff_only(stack):
    httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": "Bearer sk-sy-test-acme-web-0001"},
        json={"model": "acme/chat-small", "messages": [{"role": "user", "content": "count me"}]},
        timeout=30,
    ).raise_for_status()
    anonymous = httpx.get(f"{stack.base_url}/metrics")
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous.headers["location"]

    client = staff_client(stack)
    try:
        page = client.get("/metrics")
    finally:
        client.close()
    assert page.status_code == 200
    assert 'switchyard_requests_total{model="acme/chat-small"' in page.text
    assert "switchyard_upstream_attempts_total" in page.text
    assert "switchyard_input_estimate_ratio_bucket" in page.text
