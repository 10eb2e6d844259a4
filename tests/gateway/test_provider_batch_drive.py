"""E5: a provider batch's driver keeps its batch's lease while it waits between polls, however
long the poll interval (a lease that ran out would hand the batch to a second driver)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway import batches, provider_batches

# database_work checks its thread's connection before each call, and an earlier test on this
# worker may have left one there: database access must be allowed even with the renewal faked.
pytestmark = pytest.mark.django_db


def test_it_renews_the_lease_through_a_poll_interval_longer_than_the_lease(
    settings, monkeypatch
) -> None:
    settings.JOB_LEASE_SECONDS = 0.3  # renewed every 0.1 s
    settings.PROVIDER_BATCH_POLL_SECONDS = 0.75
    renewals: list[float] = []
    monkeypatch.setattr(
        batches, "batch_lease_extend", lambda batch_id, now: renewals.append(time.monotonic())
    )
    started = time.monotonic()

    last = asyncio.run(provider_batches._wait("batch_x", started))

    assert time.monotonic() - started >= 0.75  # it waited the whole interval
    assert len(renewals) >= 5 and last >= renewals[-1]
    gaps = [b - a for a, b in zip([started, *renewals], renewals, strict=False)]
    assert max(gaps) < settings.JOB_LEASE_SECONDS  # never long enough for the lease to lapse
