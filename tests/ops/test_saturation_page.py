"""The tenant saturation page (SPEC H2, H3): live bucket levels, charts of the ledger, shares."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from gateway.models import Generation
from ops.selectors import SPANS, capacity_share, ledger_series, queue_series, window_of
from quotas.core.learned import learned_concurrency
from quotas.core.model import Usage
from quotas.levels import broker_spec
from quotas.models import Bucket, Reservation
from quotas.snapshot import learned_buckets
from quotas.store.redis import RedisReservationStore
from routing.models import Provider
from tenants.models import Tenant
from tests.personas import Personas, generation_create

NOW = datetime(2030, 1, 1, 12, 30, 30, tzinfo=UTC)  # the hour's window: 11:31 – 12:31


def saturation(tenant: str, **query: str) -> str:
    url = reverse("ops:tenant-saturation", args=[tenant])
    return f"{url}?span={query['span']}" if "span" in query else url


def at(hh: int, mm: int, ss: int = 0) -> datetime:
    return datetime(2030, 1, 1, hh, mm, ss, tzinfo=UTC)


def row(tenant: Tenant, ident: str, when: datetime, **fields: Any) -> Generation:
    return generation_create(tenant, 0, id=ident, created_at=when, **fields)


def reserve(buckets: list[str], demand: Usage) -> None:
    """Take ``demand`` from these buckets through the broker's real store and prefix."""
    specs = [broker_spec(Bucket.objects.get(name=name)) for name in buckets]

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            store = RedisReservationStore(client, prefix=settings.REDIS_PREFIX)
            await store.bootstrap()
            grant = await store.reserve("test-saturation:1", specs, demand, lease_seconds=300)
            assert not hasattr(grant, "reason"), grant
        finally:
            await client.aclose()

    asyncio.run(run())


def levels_by_name(page: Any) -> dict[str, Any]:
    return {r.name: r for r in page.context["page"].levels.rows}


# --- who sees what ---------------------------------------------------------------------------


def test_platform_staff_see_every_tenants_page(personas: Personas) -> None:
    client = personas.client(personas.staff)

    for tenant in ("acme", "globex"):
        page = client.get(saturation(tenant))
        assert page.status_code == 200
        assert page.context["tenant"].name == tenant


def test_both_members_of_a_tenant_see_its_page(personas: Personas) -> None:
    for user in (personas.alice, personas.bob):
        assert personas.client(user).get(saturation("acme")).status_code == 200


def test_it_shows_another_tenants_page_exactly_like_a_missing_one(personas: Personas) -> None:
    foreign = personas.client(personas.carol).get(saturation("acme"))
    missing = personas.client(personas.carol).get(saturation("nobody"))

    assert foreign.status_code == missing.status_code == 404
    assert foreign.content == missing.content
    assert personas.client(personas.alice).get(saturation("globex")).status_code == 404


def test_it_sends_a_visitor_to_the_admin_login(personas: Personas) -> None:
    page = Client().get(saturation("acme"))

    assert page.status_code == 302 and reverse("admin:login") in page["Location"]


def test_it_keeps_shared_pools_and_other_tenants_from_tenant_members(
    personas: Personas,
) -> None:
    recent = timezone.now() - timedelta(minutes=2)
    # globex is a reseller's tenant and shares provider alpha with acme.
    row(personas.globex, "gen-globex-a", recent, provider="alpha", input_tokens=100)
    row(personas.acme, "gen-acme-a", recent, provider="alpha", input_tokens=300)

    member = personas.client(personas.carol).get(saturation("globex"))
    staff = personas.client(personas.staff).get(saturation("globex"))

    assert set(levels_by_name(member)) == {"tenant:globex:requests:1m"}
    html = member.content.decode()
    assert "partner:" not in html and "provider:" not in html and "model:" not in html
    assert "acme" not in html and member.context["page"].shares is None
    assert "Share of provider traffic" not in html

    seen = levels_by_name(staff)
    assert {"partner:resellerco:concurrency", "provider:alpha:requests:1m"} <= set(seen)
    assert not any(name.startswith(("provider:beta", "provider:gamma")) for name in seen)
    assert seen["provider:alpha:requests:1m"].shared
    assert seen["partner:resellerco:concurrency"].shared
    assert not seen["tenant:globex:requests:1m"].shared
    assert "acme" in staff.content.decode()  # staff see who else uses alpha


# --- live levels -------------------------------------------------------------------------------


def test_it_shows_live_levels_read_from_the_brokers_store(personas: Personas) -> None:
    Bucket.objects.create(
        name="tenant:acme:requests:1m:shadow",
        scope_kind="tenant",
        tenant=personas.acme,
        dimension="requests",
        rule="refill",
        capacity=100,
        period_seconds=60,
        shadow=True,
    )
    # A quarter of the day's tokens, a quarter of the web app's 20 concurrent requests.
    reserve(
        ["app:acme/search/web:concurrency", "tenant:acme:total_tokens:day"],
        Usage(requests=1, input_tokens=1_000_000, output_tokens=250_000, concurrency=5),
    )

    page = personas.client(personas.alice).get(saturation("acme"))

    levels = levels_by_name(page)
    assert next(iter(levels)) == "app:acme/search/web:concurrency"  # narrowest first (D1)
    day = levels["tenant:acme:total_tokens:day"]
    assert (day.capacity, day.available) == (5_000_000, 3_750_000)
    assert day.used_percent == 25.0 and day.state == "ok"
    tomorrow = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    tomorrow += timedelta(days=1)
    assert day.full_in == pytest.approx((tomorrow - datetime.now(UTC)).total_seconds(), abs=5)
    assert levels["app:acme/search/web:concurrency"].used_percent == 25.0
    assert levels["tenant:acme:spend:rolling-5h"].used_percent == 0.0
    assert levels["tenant:acme:requests:1m:shadow"].shadow
    html = page.content.decode()
    assert 'style="width: 25.0%"' in html and "25.0 %" in html
    assert ">shadow</span>" in html and "shared</span>" not in html


def test_staff_see_the_concurrency_limit_the_broker_learned_for_a_provider(
    personas: Personas,
) -> None:
    row(personas.acme, "g1", timezone.now() - timedelta(minutes=2), provider="gamma")
    row(personas.acme, "a1", timezone.now() - timedelta(minutes=2), provider="alpha")
    gamma = Provider.objects.get(name="gamma")
    [learned] = learned_buckets([gamma], {})
    spec = broker_spec(learned)
    # The very bucket the broker reserves in (and the switchback simulation builds).
    assert spec == learned_concurrency(f"provider:{gamma.id}", learned.name)

    async def refused_with_three_in_flight() -> None:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            store = RedisReservationStore(client, prefix=settings.REDIS_PREFIX)
            await store.bootstrap()
            for k in range(3):
                await store.reserve(f"test-learned:{k}", [spec], Usage(), lease_seconds=300)
            await store.observe(spec, remaining=0.0)  # gamma's 429, nothing explained it
        finally:
            await client.aclose()

    asyncio.run(refused_with_three_in_flight())
    levels = levels_by_name(personas.client(personas.staff).get(saturation("acme")))

    gamma_row = levels["provider:gamma:concurrency:learned"]
    assert gamma_row.capacity == pytest.approx(0.9 * 3, abs=0.5)  # (full: it grows 1 per 5 s)
    assert gamma_row.state == "full" and gamma_row.shared
    assert gamma_row.rule == "learned from the provider's 429s"
    assert "provider:alpha:concurrency:learned" not in levels  # alpha's limit is configured


def test_it_says_so_when_the_live_levels_cannot_be_read(personas: Personas) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens here once the socket is closed

    with override_settings(REDIS_URL=f"redis://127.0.0.1:{closed}/0"):
        page = personas.client(personas.alice).get(saturation("acme"))

    assert page.status_code == 200
    assert "Live levels are unavailable" in page.content.decode()


# --- the ledger's series -----------------------------------------------------------------------


REFUSED = {"status": 429, "attempts": 0, "input_tokens": 0, "output_tokens": 0, "cost": "0"}


@pytest.fixture
def ledger(personas: Personas) -> None:
    acme = personas.acme
    estimated = {"estimated_input_tokens": 120, "estimated_output_tokens": 200}
    row(acme, "g1", at(12, 0, 10), input_tokens=100, output_tokens=50, cost="0.5", **estimated)
    row(
        acme, "g2", at(12, 0, 40), input_tokens=200, output_tokens=50, cost="0.25", attempts=3,
        estimated_input_tokens=200, estimated_output_tokens=50,
        detail={"explanation": ["alpha:capacity", "beta:overload"]},
    )  # fmt: skip
    row(acme, "g3", at(12, 0, 59), reason_code="bucket_exhausted", **REFUSED)
    row(acme, "g4", at(12, 0, 20), reason_code="deadline", **REFUSED)
    row(
        acme, "g5", at(12, 5), status=502, reason_code="upstream_provider_error", attempts=2,
        detail={"explanation": ["gamma:provider_error", "alpha:policy"]},
    )  # fmt: skip
    row(acme, "g6", at(12, 14), input_tokens=10, output_tokens=10)
    row(acme, "g-early", at(11, 30, 59))  # before the hour's window
    row(personas.globex, "g-globex", at(12, 0, 30), reason_code="bucket_exhausted", **REFUSED)


def test_it_counts_each_minute_of_the_hour(personas: Personas, ledger: None) -> None:
    window = window_of(SPANS["1h"], NOW)

    series = ledger_series(tenant=personas.acme, window=window, providers=["alpha", "beta"])

    assert (window.start, window.end, window.count) == (at(11, 31), at(12, 31), 60)
    noon, five, fourteen = window.index(at(12, 0)), window.index(at(12, 5)), 43
    assert window.labels()[noon] == "12:00"
    assert series.served[noon] == 2 and series.served[five] == 0 and series.served[fourteen] == 1
    assert series.refused_by_reason == {
        "bucket_exhausted": [1.0 if i == noon else 0.0 for i in range(60)],
        "deadline": [1.0 if i == noon else 0.0 for i in range(60)],
    }
    assert series.deadline_expiries[noon] == 1
    assert series.failed[five] == 1 and series.failed[noon] == 0
    assert series.tokens[noon] == 400 and series.estimated_tokens[noon] == 570
    assert series.over_reserved_tokens[noon] == 170  # only g1 was over-estimated
    assert series.spend[noon] == pytest.approx(0.75)
    assert series.attempts[noon] == 2.0  # (1 + 3) / 2 dispatched; refusals never dispatched
    assert series.attempts[five] == 2.0 and series.attempts[0] is None
    assert series.upstream_429["alpha"][noon] == 1 and series.upstream_429["alpha"][five] == 1
    assert series.upstream_503["beta"][noon] == 1 and sum(series.upstream_429["beta"]) == 0
    assert sum(series.served) == 3  # nothing from before the window or from globex


def test_it_counts_each_quarter_hour_of_the_day(personas: Personas, ledger: None) -> None:
    window = window_of(SPANS["24h"], NOW)

    series = ledger_series(tenant=personas.acme, window=window, providers=[])

    assert window.count == 96 and window.end == at(12, 45)
    quarter = window.index(at(12, 0))
    assert window.labels()[quarter] == "12:00"
    assert series.served[quarter] == 3  # 12:00:10, 12:00:40 and 12:14
    assert series.failed[quarter] == 1 and series.refused[quarter] == 2
    assert series.served[quarter - 2] == 1  # 11:30:59 is in the 11:30 quarter
    assert series.upstream_429 == {}


def test_it_takes_queue_wait_percentiles_per_minute(personas: Personas) -> None:
    for i, wait in enumerate((0, 100, 200, 1000)):
        Reservation.objects.create(
            id=f"r{i}", request_id=f"g{i}", created_at=at(12, 10, i), tenant_id=personas.acme.pk,
            outcome="reconciled", queue_wait_ms=wait,
        )  # fmt: skip
    Reservation.objects.create(
        id="r-globex", request_id="x", created_at=at(12, 10), tenant_id=personas.globex.pk,
        outcome="refused", queue_wait_ms=99_000,
    )  # fmt: skip
    window = window_of(SPANS["1h"], NOW)

    queue = queue_series(tenant=personas.acme, window=window)

    i = window.index(at(12, 10))
    assert queue.percentiles
    assert queue.p50_ms[i] == pytest.approx(150) and queue.p95_ms[i] == pytest.approx(880)
    assert queue.queued[i] == 3 and queue.p50_ms[i + 1] is None


def test_staff_see_each_tenants_share_of_a_provider(personas: Personas) -> None:
    row(personas.acme, "a1", at(12, 0), provider="alpha", input_tokens=280, output_tokens=20)
    row(personas.acme, "a2", at(12, 1), provider="beta", input_tokens=50, output_tokens=50)
    row(personas.globex, "b1", at(12, 2), provider="alpha", input_tokens=80, output_tokens=20)
    row(personas.globex, "b2", at(12, 3), provider="gamma", input_tokens=80, output_tokens=20)
    row(personas.globex, "b3", at(12, 3, 1), provider="alpha", status=429)  # not served

    shares = capacity_share(tenant=personas.acme, window=window_of(SPANS["1h"], NOW))

    assert [s.provider for s in shares] == ["alpha", "beta"]  # gamma never served acme
    alpha, beta = shares
    assert (alpha.total_tokens, alpha.total_requests) == (400, 2)
    assert (alpha.tenant.name, alpha.tenant.fraction, alpha.tenant.percent) == ("acme", 0.75, 75)
    assert [(o.name, o.fraction) for o in alpha.others] == [("globex", 0.25)]
    assert beta.tenant.fraction == 1.0 and beta.others == []


# --- the page as a whole -----------------------------------------------------------------------


def test_the_page_draws_the_ledger_as_charts(personas: Personas) -> None:
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=2)
    row(personas.acme, "c1", minute + timedelta(seconds=1))
    row(personas.acme, "c2", minute + timedelta(seconds=2))
    row(personas.acme, "c3", minute + timedelta(seconds=3), status=429, reason_code="queue_full")
    client = personas.client(personas.alice)

    page = client.get(saturation("acme"))

    html = page.content.decode()
    label = minute.strftime("%H:%M")
    assert html.count('<svg class="ops-chart"') == len(page.context["page"].charts) >= 5
    assert f"{label} · served: 2" in html and f"{label} · 429 queue_full: 1" in html
    assert page.context["page"].refusals == [("queue_full", 1)]
    assert 'id="refusals"' in html
    day = client.get(saturation("acme", span="24h"))
    assert day.context["page"].window.count == 96
    assert client.get(saturation("acme", span="1y")).context["page"].window.count == 60


def test_an_empty_tenant_renders_without_errors(personas: Personas) -> None:
    Tenant.objects.create(name="empty")

    page = personas.client(personas.staff).get(saturation("empty"))

    assert page.status_code == 200
    html = page.content.decode()
    assert "No limits apply" in html and "No provider served this tenant" in html
    assert page.context["page"].stats[0].value == "0"


def test_the_tabs_and_the_tenant_admin_link_to_the_page(personas: Personas) -> None:
    client = personas.client(personas.alice)

    page = client.get(saturation("acme"))
    tenant_page = client.get(reverse("admin:tenants_tenant_change", args=[personas.acme.pk]))
    listing = client.get(reverse("admin:tenants_tenant_changelist"))

    tabs = [(t.label, t.active) for t in page.context["tabs"]]
    assert tabs == [("Activity", False), ("Saturation", True)]
    assert saturation("acme") in tenant_page.content.decode()
    assert saturation("acme") in listing.content.decode()


@pytest.mark.parametrize("user", ["alice", "staff"])
def test_it_shows_a_bucket_it_cannot_count_as_invalid_instead_of_failing(
    personas: Personas, user: str
) -> None:
    # Saved before the admin checked time zones: the broker leaves it out, the page says so.
    web = Bucket.objects.get(name="app:acme/search/web:concurrency").app
    Bucket.objects.create(
        name="app:acme/search/web:requests:day",
        scope_kind="app",
        app=web,
        dimension="requests",
        rule="fixed_window",
        capacity=100,
        window="day",
        timezone="Europe/Berlinn",
    )
    page = personas.client(getattr(personas, user)).get(saturation("acme"))

    assert page.status_code == 200
    text = page.content.decode()
    assert "Not counted, its configuration is invalid" in text
    assert "unknown time zone" in text and "Europe/Berlinn" in text
    assert "app:acme/search/web:concurrency" in text  # the other buckets are still shown
