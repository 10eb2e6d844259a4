"""Header value parsers: Go durations, RFC 3339 resets, Retry-After in all its forms."""

from __future__ import annotations

import email.utils

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.providers.headers import (
    has_retry_after,
    lower_keys,
    parse_go_duration,
    parse_number,
    parse_retry_after,
    parse_rfc3339,
    seconds_until,
)

NOW = 1_750_000_000.0  # 2025-06-15T15:06:40Z


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("12ms", 0.012),
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("23h47m36.648s", 23 * 3600 + 47 * 60 + 36.648),
        ("1h0m0s", 3600.0),
        ("0s", 0.0),
        ("1.5µs", 1.5e-6),
        ("250us", 250e-6),
        ("7ns", 7e-9),
        ("2m30.5s", 150.5),
        # Azure sends plain seconds
        ("60", 60.0),
        ("0.5", 0.5),
        (" 6m0s ", 360.0),
    ],
)
def test_it_parses_go_durations_and_plain_seconds(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", [None, "", "abc", "6m0", "s", "-1s", "-1", "1x", "NaN", "inf", "1s2", "m1s", "1 s"]
)
def test_it_rejects_garbled_durations(text: str | None) -> None:
    assert parse_go_duration(text) is None


@given(st.text(max_size=30))
def test_it_never_raises_on_any_duration_text(text: str) -> None:
    result = parse_go_duration(text)
    assert result is None or result >= 0


@given(
    st.integers(0, 99),
    st.integers(0, 59),
    st.integers(0, 59),
    st.integers(0, 999),
)
def test_it_reads_every_go_formatted_duration(h: int, m: int, s: int, ms: int) -> None:
    go = f"{h}h{m}m{s}.{ms:03d}s" if h else f"{m}m{s}.{ms:03d}s"
    assert parse_go_duration(go) == pytest.approx(h * 3600 + m * 60 + s + ms / 1000)


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("2025-06-15T15:06:40Z", NOW),
        ("2025-06-15T15:07:10.5Z", NOW + 30.5),
        ("2025-06-15T17:06:40+02:00", NOW),
        ("2025-06-15T15:06:40.123456789Z", NOW + 0.123456),
        ("2025-06-15T15:06:40", NOW),  # no offset: UTC
    ],
)
def test_it_parses_rfc3339(text: str, epoch: float) -> None:
    assert parse_rfc3339(text) == pytest.approx(epoch)


@pytest.mark.parametrize("text", [None, "", "tomorrow", "2025-13-01T00:00:00Z", "1750000000"])
def test_it_rejects_garbled_timestamps(text: str | None) -> None:
    assert parse_rfc3339(text) is None


def test_it_floors_a_past_reset_at_zero() -> None:
    assert seconds_until("2025-06-15T15:06:00Z", now=NOW) == 0.0
    assert seconds_until("2025-06-15T15:07:00Z", now=NOW) == pytest.approx(20.0)


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # ms wins, like the SDKs
        ({"x-ms-retry-after-ms": "1200"}, 1.2),
        ({"retry-after-ms": "junk", "retry-after": "3"}, 3.0),  # garbled ms falls through
        ({"retry-after": email.utils.formatdate(NOW + 42, usegmt=True)}, 42.0),
        ({"retry-after": email.utils.formatdate(NOW - 42, usegmt=True)}, 0.0),
        ({"retry-after": "Wed, 99 Foo 2025 99:99:99 GMT"}, None),
        ({"retry-after": "-5"}, None),
        ({"retry-after": ""}, None),
        ({}, None),
    ],
)
def test_it_reads_retry_after_in_every_form(headers: dict[str, str], seconds: float | None) -> None:
    result = parse_retry_after(headers, now=NOW)
    assert result == (pytest.approx(seconds) if seconds is not None else None)
    assert has_retry_after(headers) is (seconds is not None)


def test_it_lowercases_header_names() -> None:
    assert lower_keys({"Retry-After": "3", "X-RateLimit-Limit-Requests": "60"}) == {
        "retry-after": "3",
        "x-ratelimit-limit-requests": "60",
    }


@pytest.mark.parametrize(
    ("text", "number"), [("60", 60.0), ("149984", 149984.0), ("-1", None), ("x", None)]
)
def test_it_parses_only_sane_numbers(text: str, number: float | None) -> None:
    assert parse_number(text) == number
