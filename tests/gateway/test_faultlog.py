"""Failures of one kind are logged once per interval, with a count of the ones not logged."""

from __future__ import annotations

import logging

import pytest

from common.faultlog import FaultLog


def fail(faults: FaultLog, kind: str) -> None:
    try:
        raise ConnectionError("Redis is away")
    except ConnectionError:
        faults.warning(logging.getLogger("test"), kind, "Redis failed")


def test_it_logs_one_line_per_kind_per_interval_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    faults = FaultLog(interval=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING)

    for _ in range(500):  # a burst of one kind, and one of another
        fail(faults, "request")
    fail(faults, "pump")
    now[0] = 110.0
    fail(faults, "request")

    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "Redis failed",
        "Redis failed",
        "Redis failed (and 499 more times since the last report)",
    ]
    assert all(record.exc_info for record in caplog.records)  # the traceback, once a line
