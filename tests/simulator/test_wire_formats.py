"""Header value formats of the two wire protocols."""

import pytest

from simulator.server.common import go_duration, rfc3339


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0004, "0s"),
        (0.012, "12ms"),
        (0.12, "120ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59.999, "59.999s"),
        (360, "6m0s"),
        (3600, "1h0m0s"),
        (85656.648, "23h47m36.648s"),
    ],
)
def test_it_formats_go_durations_like_openai(seconds, text):
    assert go_duration(seconds) == text


def test_it_formats_rfc3339_resets_rounded_up_to_the_second():
    assert rfc3339(1_700_000_000.2) == "2023-11-14T22:13:21Z"
    assert rfc3339(1_700_000_000.0) == "2023-11-14T22:13:20Z"
