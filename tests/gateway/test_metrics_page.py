"""``/metrics`` (SPEC H2): live saturation read at the scrape; it names every tenant in its
labels, so it is for platform operators only (A4)."""

from __future__ import annotations

import asyncio
import socket
import time
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings
from django.utils import timezone

from common import redis as sy_redis
from quotas.core.model import Usage
from quotas.levels import broker_spec
from quotas.models import Bucket
from quotas.snapshot import learned_buckets
from quotas.store.queue_redis import queue_prefix
from quotas.store.redis import RedisReservationStore
from routing.models import Provider
from tests.personas import Personas, job_create


def test_it_shows_metrics_to_platform_staff(personas: Personas) -> None:
    page = personas.client(personas.staff).get("/metrics")
    assert page.status_code == 200
    assert b"switchyard_requests_total" in page.content


@pytest.mark.parametrize("member", ["alice", "bob", "carol"])
def test_it_never_shows_metrics_to_a_tenant_member(personas: Personas, member: str) -> None:
    # Members are staff (they sign in to the admin), yet the labels name other tenants.
    user = getattr(personas, member)
    assert user.is_staff
    page = personas.client(user).get("/metrics")
    assert page.status_code == 403
    assert b"switchyard_" not in page.content


def test_it_asks_a_visitor_for_a_bearer_token_not_a_login(personas: Personas) -> None:
    page = Client().get("/metrics")
    assert page.status_code == 401
    assert page["WWW-Authenticate"].startswith("Bearer")
    assert b"switchyard_" not in page.content


@override_settings(METRICS_TOKENS=["old-scrape-token", "new-scrape-token"])
@pytest.mark.parametrize("token", ["old-scrape-token", "new-scrape-token"])
def test_it_shows_metrics_to_a_scraper_with_a_configured_token(
    personas: Personas, token: str
) -> None:
    page = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/plain; version=")
    assert b"switchyard_requests_total" in page.content


@override_settings(METRICS_TOKENS=["scrape-token"])
@pytest.mark.parametrize("header", ["Bearer scrape-tokenX", "Bearer ", "Basic scrape-token", ""])
def test_it_refuses_a_wrong_token(personas: Personas, header: str) -> None:
    page = Client().get("/metrics", HTTP_AUTHORIZATION=header)
    assert page.status_code == 401 and b"switchyard_" not in page.content


@override_settings(METRICS_TOKENS=[])
def test_no_token_opens_metrics_when_none_is_configured(personas: Personas) -> None:
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def _gauges(page: Any, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric in a Prometheus text page."""
    prefix = name + "{"
    return {
        line[len(prefix) : line.rindex("}")]: float(line.rsplit(" ", 1)[1])
        for line in page.content.decode().splitlines()
        if line.startswith(prefix)
    }


def test_it_reads_each_buckets_level_and_each_providers_queue_at_the_scrape(
    personas: Personas,
) -> None:
    # The web app's concurrency: 5 of 20 held, in the broker's own store (as the proxy does).
    web = broker_spec(Bucket.objects.get(name="app:acme/search/web:concurrency"))
    gamma = Provider.objects.get(name="gamma")
    [learned] = learned_buckets([gamma], {})

    async def hold() -> None:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            store = RedisReservationStore(client, prefix=settings.REDIS_PREFIX)
            await store.bootstrap()
            await store.reserve("test-metrics:1", [web], Usage(concurrency=5), lease_seconds=300)
            for k in range(4):  # gamma refuses with four in flight: its learned limit drops
                spec = broker_spec(learned)
                await store.reserve(f"test-metrics:g{k}", [spec], Usage(), lease_seconds=300)
            await store.observe(broker_spec(learned), remaining=0.0)
            await client.zadd(f"{queue_prefix(settings.REDIS_PREFIX, f'provider:{gamma.id}')}:d",
                              {"w1": 1e12, "w2": 1e12})  # fmt: skip
        finally:
            await client.aclose()

    asyncio.run(hold())
    page = personas.client(personas.staff).get("/metrics")

    web_labels = 'bucket="app:acme/search/web:concurrency",dimension="concurrency",scope="app"'
    assert _gauges(page, "switchyard_bucket_capacity")[web_labels] == 20
    assert _gauges(page, "switchyard_bucket_available")[web_labels] == 15
    gamma_labels = (
        'bucket="provider:gamma:concurrency:learned",dimension="concurrency",scope="provider"'
    )
    assert _gauges(page, "switchyard_bucket_capacity")[gamma_labels] == pytest.approx(3.6, abs=0.5)
    assert _gauges(page, "switchyard_provider_queue_depth")['provider="gamma"'] == 2
    assert _gauges(page, "switchyard_provider_queue_depth")['provider="alpha"'] == 0


def test_it_still_answers_the_scrape_when_the_store_cannot_be_read(
    personas: Personas, settings: Any
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        settings.REDIS_URL = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    page = personas.client(personas.staff).get("/metrics")
    assert page.status_code == 200
    assert b"switchyard_requests_total" in page.content
    assert b"switchyard_bucket_available{" not in page.content


def test_it_still_answers_the_scrape_when_a_bucket_cannot_be_counted(
    personas: Personas,
) -> None:
    # A row saved before the admin refused negative durations: left out, not a 500.
    web = Bucket.objects.get(name="app:acme/search/web:concurrency").app
    Bucket.objects.create(
        name="app:acme/search/web:requests:rolling",
        scope_kind="app",
        app=web,
        dimension="requests",
        rule="rolling_window",
        capacity=100,
        duration_seconds=-3600,
    )
    page = personas.client(personas.staff).get("/metrics")

    assert page.status_code == 200
    capacities = _gauges(page, "switchyard_bucket_capacity")
    web_labels = 'bucket="app:acme/search/web:concurrency",dimension="concurrency",scope="app"'
    assert capacities[web_labels] == 20
    assert not any("requests:rolling" in labels for labels in capacities)


def test_it_requires_the_ops_pages_permission_of_staff(personas: Personas) -> None:
    # Staff with no permission (e.g. a support desk) get 404 on the ops pages, 403 here.
    operator = User.objects.create_user("operator", is_staff=True)
    assert personas.client(operator).get("/metrics").status_code == 403

    operator.user_permissions.add(Permission.objects.get(codename="view_tenant"))
    operator = User.objects.get(pk=operator.pk)  # permissions are cached per instance
    page = personas.client(operator).get("/metrics")
    assert page.status_code == 200
    assert b"switchyard_requests_total" in page.content


def test_it_reports_the_ledger_backlog_at_the_scrape(personas: Personas) -> None:
    # Three records queued, two claimed by a flush that has not stored them yet.
    client = sy_redis.sync_client()
    client.rpush(sy_redis.key("ledger"), b"{}", b"{}", b"{}")
    claim = sy_redis.key("ledger", "claim", "test")
    client.rpush(claim, b"{}", b"{}")
    client.zadd(sy_redis.key("ledger", "claims"), {claim: time.time()})

    page = personas.client(personas.staff).get("/metrics")

    assert _gauges_plain(page, "switchyard_ledger_backlog") == 5


def test_it_counts_the_deferred_jobs_not_finished_at_the_scrape(personas: Personas) -> None:
    now = timezone.now()
    job_create(personas.acme, 1, status="queued", created_at=now - timedelta(minutes=5))
    job_create(personas.acme, 2, status="queued", created_at=now - timedelta(minutes=1))
    job_create(personas.acme, 3, status="running")
    job_create(personas.globex, 4)  # finished: not counted

    page = personas.client(personas.staff).get("/metrics")

    jobs = _gauges(page, "switchyard_jobs")
    assert jobs == {'status="queued",tenant="acme"': 2, 'status="running",tenant="acme"': 1}
    assert 300 <= _gauges_plain(page, "switchyard_job_oldest_wait_seconds") < 310


def _gauges_plain(page: Any, name: str) -> float:
    [value] = [
        float(line.rsplit(" ", 1)[1])
        for line in page.content.decode().splitlines()
        if line.startswith(name + " ")
    ]
    return value
