"""The bucket admin refuses what ``loadconfig`` refuses (a limit the quota snapshot could not
build stops configuration changes for every tenant), with an error on the field at fault."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from hypothesis import assume, given
from hypothesis import strategies as st

from common.durations import duration_parse
from common.reader import Errors, Section
from quotas.limits import parse_limit
from quotas.models import Bucket
from quotas.snapshot import quota_snapshot_build
from quotas.validation import bucket_defaults, bucket_errors
from routing.models import Provider
from tenants.models import App
from tests.personas import Personas

ADD = reverse("admin:quotas_bucket_add")
LIMIT = {
    "name": "",
    "source": "configured",
    "dimension": "requests",
    "rule": "refill",
    "capacity": "10",
    "period_seconds": "60",
}


def app_limit(personas: Personas, **fields: str) -> dict[str, str]:
    app = App.objects.get(team__tenant=personas.acme, name="web")
    return {**LIMIT, "scope_kind": "app", "app": str(app.pk), **fields}


def refused(client: Client, data: dict[str, str], field: str) -> str:
    """The form's errors on ``field``, after checking that nothing was saved."""
    count = Bucket.objects.count()
    answer = client.post(ADD, data)
    assert answer.status_code == 200, "saved: " + str(data)
    assert Bucket.objects.count() == count
    errors = answer.context["adminform"].form.errors
    assert field in errors, errors
    return " ".join(errors[field])


# One family per row: what the admin used to save, and the field the error must name.
BAD_LIMITS = {
    "negative rolling duration": (
        {"rule": "rolling_window", "period_seconds": "", "duration_seconds": "-3600"},
        "duration_seconds",
        "positive",
    ),
    "zero rolling duration": (
        {"rule": "rolling_window", "period_seconds": "", "duration_seconds": "0"},
        "duration_seconds",
        "",
    ),
    "negative refill period": ({"period_seconds": "-60"}, "period_seconds", "positive"),
    "ramp factor below 1": (
        {"dimension": "ramp", "rule": "ramp", "capacity": "", "factor": "0.5"},
        "factor",
        "greater than 1",
    ),
    "ramp factor of 1": (
        {"dimension": "ramp", "rule": "ramp", "capacity": "", "factor": "1"},
        "factor",
        "greater than 1",
    ),
    "negative ramp factor": (
        {"dimension": "ramp", "rule": "ramp", "capacity": "", "factor": "-2"},
        "factor",
        "positive",
    ),
    "negative ramp floor": (
        {"dimension": "ramp", "rule": "ramp", "capacity": "-5", "factor": "2"},
        "capacity",
        "positive",
    ),
    "unknown timezone": (
        {
            "rule": "fixed_window",
            "period_seconds": "",
            "window": "day",
            "timezone": "Europe/Berlinn",
        },
        "timezone",
        "unknown time zone",
    ),
    "refill with a window length": ({"duration_seconds": "300"}, "duration_seconds", "not allowed"),
    "rolling window with a calendar window": (
        {"rule": "rolling_window", "period_seconds": "", "duration_seconds": "60", "window": "day"},
        "window",
        "not allowed",
    ),
    "fixed window without a window": (
        {"rule": "fixed_window", "period_seconds": "", "timezone": "UTC"},
        "window",
        "required",
    ),
    "refill without a period": ({"period_seconds": ""}, "period_seconds", "required"),
    "concurrency rule on requests": (
        {"rule": "concurrency", "period_seconds": ""},
        "rule",
        "concurrency dimension",
    ),
    "concurrency with a period": (
        {"dimension": "concurrency", "rule": "concurrency"},
        "period_seconds",
        "not allowed",
    ),
    "zero capacity": ({"capacity": "0"}, "capacity", "positive"),
}


@pytest.mark.parametrize(("fields", "field", "words"), BAD_LIMITS.values(), ids=list(BAD_LIMITS))
def test_it_refuses_a_members_limit_that_loadconfig_refuses(
    personas: Personas, fields: dict[str, str], field: str, words: str
) -> None:
    message = refused(personas.client(personas.alice), app_limit(personas, **fields), field)

    assert words in message


def test_it_refuses_a_platform_limit_that_loadconfig_refuses(personas: Personas) -> None:
    alpha = Provider.objects.get(name="alpha")
    data = {**LIMIT, "scope_kind": "provider", "provider": str(alpha.pk), "period_seconds": "-1"}

    refused(personas.client(personas.staff), data, "period_seconds")

    quota_snapshot_build()  # and the configuration still builds


GOOD_LIMITS = {
    "refill": ({}, "app:acme/search/web:requests:1m"),
    "rolling window": (
        {"rule": "rolling_window", "period_seconds": "", "duration_seconds": "18000"},
        "app:acme/search/web:requests:rolling-5h",
    ),
    "ramp without a floor": (
        {"dimension": "ramp", "rule": "ramp", "capacity": "", "factor": "2"},
        "app:acme/search/web:ramp:1m",
    ),
    "concurrency": (
        {"dimension": "concurrency", "rule": "concurrency", "period_seconds": "", "shadow": "on"},
        "app:acme/search/web:concurrency:shadow",
    ),
    "fixed window in a zone": (
        {
            "rule": "fixed_window",
            "period_seconds": "",
            "window": "day",
            "resets_at": "06:00",
            "timezone": "America/Los_Angeles",
        },
        "app:acme/search/web:requests:day",
    ),
}


@pytest.mark.parametrize(("fields", "name"), GOOD_LIMITS.values(), ids=list(GOOD_LIMITS))
def test_it_saves_a_good_limit(personas: Personas, fields: dict[str, str], name: str) -> None:
    answer = personas.client(personas.alice).post(ADD, app_limit(personas, **fields))

    assert answer.status_code == 302, answer.context["adminform"].form.errors
    assert Bucket.objects.filter(name=name).exists()
    quota_snapshot_build()


def test_a_fixed_window_without_a_zone_resets_at_midnight_utc_as_in_the_file(
    personas: Personas,
) -> None:
    fields = {"rule": "fixed_window", "period_seconds": "", "window": "day"}

    answer = personas.client(personas.staff).post(ADD, app_limit(personas, **fields))

    assert answer.status_code == 302
    bucket = Bucket.objects.get(name="app:acme/search/web:requests:day")
    assert (bucket.timezone, bucket.resets_at) == ("UTC", dt.time(0, 0))


@pytest.mark.parametrize("scope_kind", ["", "team"])
def test_it_names_the_scope_kind_a_limit_is_missing(personas: Personas, scope_kind: str) -> None:
    data = app_limit(personas, scope_kind=scope_kind)

    message = refused(personas.client(personas.staff), data, "scope_kind")

    assert "  " not in message and "the  scope" not in message
    if scope_kind:
        assert "team" in message


def test_it_shows_a_bad_limit_saved_before_validation(personas: Personas) -> None:
    bucket = Bucket.objects.get(scope_kind="app", app__name="web")
    Bucket.objects.filter(pk=bucket.pk).update(duration_seconds=-5, timezone="Mars/Base")
    client = personas.client(personas.alice)

    page = client.get(reverse("admin:quotas_bucket_change", args=[bucket.pk]))
    listing = client.get(reverse("admin:quotas_bucket_changelist"))

    assert page.status_code == listing.status_code == 200


# --- The same verdict as the file, on limits written both ways ----------------------------------

# (model value, file spelling): durations in seconds and as the file writes them.
SECONDS = [(60.0, "1m"), (0.5, "500ms"), (0.0, "0s"), (-60.0, "-60s")]
_FILE_LIMITS = st.fixed_dictionaries(
    {"dimension": st.sampled_from(["requests", "spend", "concurrency", "ramp"])},
    optional={
        "capacity": st.sampled_from([10, 0.5, 0, -1]),
        "per": st.sampled_from([s for _, s in SECONDS]),
        "window": st.sampled_from(["day", "hour", "rolling"]),
        "duration": st.sampled_from([s for _, s in SECONDS]),
        "resets_at": st.just("06:00"),
        "timezone": st.sampled_from(["UTC", "Europe/Berlin", "Europe/Berlinn"]),
        "factor": st.sampled_from([2, 1.5, 1, 0.5, -2]),
    },
)


def _seconds(spelling: str | None) -> float | None:
    if spelling is None:
        return None
    return {s: v for v, s in SECONDS}.get(spelling, duration_parse(spelling))


def _model_values(limit: dict[str, Any]) -> dict[str, Any] | None:
    """The ``Bucket`` fields an admin user would give for this file limit (None: no rule)."""
    dimension, window = limit["dimension"], limit.get("window", "")
    if dimension in ("concurrency", "ramp"):
        rule = dimension
    elif "per" in limit and "window" not in limit:
        rule = "refill"
    elif window == "rolling":
        rule = "rolling_window"
    elif window and "per" not in limit:
        rule = "fixed_window"
    else:
        return None  # the file refuses it before a rule exists; the admin always has one
    if window == "rolling" and rule != "rolling_window":
        return None  # the admin has no "rolling" window to misplace
    hours, minutes = map(int, limit.get("resets_at", "00:00").split(":"))
    values = {
        "dimension": dimension,
        "rule": rule,
        "capacity": limit.get("capacity"),
        "period_seconds": _seconds(limit.get("per")),
        "window": "" if window == "rolling" else window,
        "resets_at": dt.time(hours, minutes) if "resets_at" in limit else None,
        "timezone": limit.get("timezone", ""),
        "duration_seconds": _seconds(limit.get("duration")),
        "factor": limit.get("factor"),
    }
    return {**values, **bucket_defaults(values)}


@given(_FILE_LIMITS)
def test_it_refuses_a_limit_exactly_when_the_file_does(limit: dict[str, Any]) -> None:
    values = _model_values(limit)
    assume(values is not None)
    errors = Errors()

    parse_limit(Section(limit, "limit", errors))

    assert bool(errors.messages) == bool(bucket_errors(values or {})), (errors.messages, values)
