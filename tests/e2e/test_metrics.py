"""Operator metrics (H2): Prometheus text at /metrics, for staff only."""

import httpx
import pytest

from tests.stack import staff_client

pytestmark = pytest.mark.e2e


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
