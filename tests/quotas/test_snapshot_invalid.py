"""Buckets already in the database that cannot be counted (SPEC B1): the snapshot leaves each
one out with an ERROR naming it, and keeps every other tenant's configuration working."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from quotas.core.specs import bucket_spec_build
from quotas.models import Bucket
from quotas.snapshot import bucket_spec_or_none, quota_snapshot_build, with_learned_buckets
from routing.models import Provider
from tenants.models import App
from tests.personas import Personas

# Rows an older admin accepted (the admin now refuses them): saved without ``full_clean``.
BAD_ROWS: dict[str, dict[str, Any]] = {
    "negative rolling duration": {
        "dimension": "requests",
        "rule": "rolling_window",
        "capacity": 100,
        "duration_seconds": -3600,
    },
    "negative refill period": {
        "dimension": "requests",
        "rule": "refill",
        "capacity": 100,
        "period_seconds": -60,
    },
    "negative ramp factor": {"rule": "ramp", "capacity": 10, "period_seconds": 60, "factor": -2},
    "unknown time zone": {
        "dimension": "requests",
        "rule": "fixed_window",
        "capacity": 100,
        "window": "day",
        "timezone": "Europe/Berlinn",
    },
    "unknown rule": {"dimension": "requests", "rule": "leaky", "capacity": 100},
}


def bad_bucket(fields: dict[str, Any], *, name: str = "app:acme/search/web:broken") -> Bucket:
    web = App.objects.get(name="web", team__tenant__name="acme")
    return Bucket.objects.create(name=name, scope_kind="app", app=web, **fields)


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_it_builds_the_snapshot_without_a_bucket_it_cannot_count(
    personas: Personas, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    bad = bad_bucket(BAD_ROWS[case])
    with caplog.at_level(logging.ERROR, logger="quotas.snapshot"):
        snapshot = quota_snapshot_build()

    web = snapshot.buckets[("app", bad.app_id)]
    names = {b.spec.name for b in web}
    assert bad.name not in names
    assert "app:acme/search/web:concurrency" in names  # the app's other limits still count
    globex = personas.globex.pk
    assert snapshot.buckets[("tenant", globex)]  # and every other tenant's
    [record] = [r for r in caplog.records if bad.name in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert str(bad.pk) in record.getMessage()


def test_it_refuses_an_unknown_time_zone_when_the_spec_is_built() -> None:
    # Caught once, when the configuration is read, not by each request computing its window.
    fields: dict[str, Any] = {
        "scope": "app:1",
        "dimension": "requests",
        "rule": "fixed_window",
        "capacity": 10.0,
        "period_seconds": None,
        "duration_seconds": None,
        "window": "day",
        "resets_at": None,
        "factor": None,
        "shadow": False,
    }
    for zone in ("Europe/Berlinn", "Europe", "../etc/passwd", "Mars/Olympus"):
        with pytest.raises(ValueError, match="unknown time zone"):
            bucket_spec_build(name="daily", timezone=zone, **fields)
    spec = bucket_spec_build(name="daily", timezone="America/Los_Angeles", **fields)
    assert spec.timezone == "America/Los_Angeles"
    assert bucket_spec_build(name="daily", timezone="", **fields).timezone == "UTC"


def test_it_lets_a_provider_learn_its_limit_when_its_configured_one_is_invalid(
    personas: Personas, settings: Any
) -> None:
    settings.LEARN_PROVIDER_CONCURRENCY = True
    gamma = Provider.objects.get(name="gamma")
    assert not Bucket.objects.filter(provider=gamma, rule="concurrency").exists()
    broken = Bucket.objects.create(
        name="provider:gamma:concurrency",
        scope_kind="provider",
        provider=gamma,
        dimension="concurrency",
        rule="concurrency",
        capacity=-4,
    )
    assert bucket_spec_or_none(broken) is None

    shown = with_learned_buckets([broken], [gamma])
    snapshot = quota_snapshot_build()

    # The pages and the broker agree: the invalid row is not counted, the learned one is.
    assert [b.name for b in shown] == [broken.name, "provider:gamma:concurrency:learned"]
    counted = {b.spec.name for b in snapshot.buckets[("provider", gamma.pk)]}
    assert "provider:gamma:concurrency:learned" in counted
    assert broken.name not in counted
