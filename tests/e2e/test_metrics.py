"""Operator metrics (H2): Prometheus text at /metrics, for a scraper's bearer token or staff;
the Grafana dashboard in ops/observability queries only metrics a real scrape has."""

import copy
import json
import os
import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_redis_restart import CONFIG, KEY, MARKET
from tests.stack import SCRAPE_TOKEN, Stack, staff_client

pytestmark = pytest.mark.e2e

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "observability" / "grafana-dashboard.json"


def test_it_shows_metrics_to_a_scraper_and_to_staff_only(stack):
    httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": "Bearer sk-sy-test-acme-web-0001"},
        json={"model": "acme/chat-small", "messages": [{"role": "user", "content": "count me"}]},
        timeout=30,
    ).raise_for_status()
    anonymous = httpx.get(f"{stack.base_url}/metrics")
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith(
        "Bearer"
    )
    scraped = httpx.get(
        f"{stack.base_url}/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"}
    )

    client = staff_client(stack)
    try:
        page = client.get("/metrics")
    finally:
        client.close()
    for response in (page, scraped):
        assert response.status_code == 200
        assert 'switchyard_requests_total{door="chat",model="acme/chat-small"' in response.text
        assert "switchyard_upstream_attempts_total" in response.text
        assert "switchyard_input_estimate_ratio_bucket" in response.text


def test_probes_are_not_counted_as_requests(stack):
    before = _samples(_scrape(stack))
    for _ in range(5):
        httpx.get(f"{stack.base_url}/healthz").raise_for_status()
        httpx.get(f"{stack.base_url}/readyz").raise_for_status()
    after = _samples(_scrape(stack))
    requests = {k: v for k, v in after.items() if k[0] == "switchyard_requests_total"}
    assert requests == {k: v for k, v in before.items() if k[0] == "switchyard_requests_total"}
    assert not any("healthz" in str(k) or "readyz" in str(k) for k in after)


@pytest.fixture
def limited_stack(tmp_path):
    """One provider, one app allowed 3 requests a minute: a burst is served, then refused."""
    config = copy.deepcopy(CONFIG)
    config["tenants"][0]["teams"][0]["apps"][0]["limits"] = [
        {"dimension": "requests", "capacity": 3, "per": "1m"}
    ]
    (tmp_path / "market.yaml").write_text(yaml.safe_dump(MARKET))
    (tmp_path / "switchyard.yaml").write_text(yaml.safe_dump(config))
    stack = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        market=tmp_path / "market.yaml",
        config=tmp_path / "switchyard.yaml",
        celery=False,
        latency_scale=0.2,
    )
    try:
        yield stack.start()
    finally:
        stack.stop()


def test_every_metric_the_dashboard_queries_is_in_a_real_scrape(limited_stack):
    stack = limited_stack
    statuses = []
    for stream in (False, True, False, False, False):
        response = httpx.post(
            f"{stack.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={
                "model": "restart/m",
                "messages": [{"role": "user", "content": "scrape me"}],
                "max_tokens": 20,
                "stream": stream,
            },
            timeout=30,
        )
        statuses.append(response.status_code)
    assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:]

    exposed = {name for name, _ in _samples(_scrape(stack))}
    queried = _dashboard_metrics()
    assert len(queried) >= 10
    assert queried <= exposed, f"not in the scrape: {sorted(queried - exposed)}"


def test_the_dashboard_is_valid_grafana_json():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["panels"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
        assert panel["datasource"]["uid"] == "${datasource}"


def _dashboard_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return {name for expr in exprs for name in re.findall(r"\bswitchyard_[a-z0-9_]+", expr)}


def _scrape(stack):
    response = httpx.get(
        f"{stack.base_url}/metrics",
        headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"},
        timeout=10,
    )
    response.raise_for_status()
    return response.text


def _samples(text):
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
