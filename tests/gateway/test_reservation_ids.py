"""Reservation ids: unique per request and per run of a deferred job (issue 13, defect 4).

A job's re-run after its worker died used the dead run's ids again, so its first reserve met
the dead run's expired reservation and dispatched on it, replayed as a grant, with no capacity.
"""

from __future__ import annotations

from gateway.admission import _reservation_id
from gateway.call import Call


def ids(call: Call, n: int) -> list[str]:
    return [_reservation_id(call) for _ in range(n)]


def test_each_run_of_a_job_reserves_under_ids_of_its_own() -> None:
    dead_run = ids(Call(id="gen-abc", run=1), 3)
    re_run = ids(Call(id="gen-abc", run=2), 3)

    assert len(set(dead_run)) == 3
    assert not set(dead_run) & set(re_run)
    # The request's id stays the prefix, as the ledger's reservations are joined on it.
    assert {i.rsplit(":", 1)[0] for i in dead_run + re_run} == {"gen-abc"}


def test_a_request_that_is_no_job_keeps_its_plain_ids() -> None:
    assert ids(Call(id="gen-abc"), 2) == ["gen-abc:1", "gen-abc:2"]
