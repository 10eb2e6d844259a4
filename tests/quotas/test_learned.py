"""A concurrency limit learned from a provider's 429s (quotas.core.learned; SPEC B1, G10, F2)."""

from __future__ import annotations

import heapq
import itertools

from quotas.core.book import Book
from quotas.core.learned import (
    CUT,
    learned_concurrency,
    needs_learned_concurrency,
    refusal_unexplained,
)
from quotas.core.model import BucketSpec, Dimension, Grant, Rule, Usage

RPM = BucketSpec("rpm", "provider:1", Dimension.REQUESTS, Rule.REFILL, 600, 60)
CONCURRENCY = BucketSpec("conc", "provider:1", Dimension.CONCURRENCY, Rule.CONCURRENCY, 64)


def test_it_reads_a_429_as_a_concurrency_signal_only_when_no_reported_limit_explains_it():
    assert refusal_unexplained([])  # no rate-limit headers at all
    assert refusal_unexplained([(37, 1), (5000, 1200)])  # room left in every reported limit
    assert refusal_unexplained([(None, 1)])  # a limit without its remaining count
    assert not refusal_unexplained([(37, 1), (800, 1200)])  # short of this request's tokens
    assert not refusal_unexplained([(0, 1)])  # no requests left this minute


def test_it_learns_only_where_no_concurrency_limit_is_configured():
    assert needs_learned_concurrency([RPM])
    assert not needs_learned_concurrency([RPM, CONCURRENCY])
    shadow = BucketSpec(
        "trial", "provider:1", Dimension.CONCURRENCY, Rule.CONCURRENCY, 8, shadow=True
    )
    assert needs_learned_concurrency([RPM, shadow])  # a shadow limit holds nothing back


def run_against_a_hidden_limit(limit: int, *, clients: int, seconds: float, service_s: float):
    """Clients in a closed loop through the book with a learned bucket, to a provider that
    refuses (429, no headers) beyond ``limit`` requests in flight. Returns (answers, 429s,
    mean requests in flight at the provider)."""
    book = Book(max_lease_seconds=60.0)
    learned = learned_concurrency("provider:9", "provider:p:concurrency:learned")
    events: list[tuple[float, int, str, int]] = []
    order = itertools.count()
    for client in range(clients):
        heapq.heappush(events, (client * 0.01, next(order), "try", client))
    in_flight = answers = refused = 0
    area, last = 0.0, 0.0
    grants: dict[int, Grant] = {}
    while events:
        now, _, kind, client = heapq.heappop(events)
        if now > seconds:
            break
        area, last = area + in_flight * (now - last), now
        if kind == "done":
            in_flight -= 1
            answers += 1
            book.settle(grants.pop(client), Usage(), now=now)
            heapq.heappush(events, (now, next(order), "try", client))
            continue
        if kind == "refused":  # the gateway releases first, then tells the broker
            book.settle(grants.pop(client), None, now=now)
            book.observe(learned, remaining=0.0, reset_at=0.0, now=now)
            heapq.heappush(events, (now + 0.05, next(order), "try", client))
            continue
        grant = book.reserve(f"{client}-{now}", [learned], Usage(), now=now, lease_seconds=60.0)
        if not isinstance(grant, Grant):  # the broker holds it back: wait for a slot
            heapq.heappush(events, (now + 0.05, next(order), "try", client))
        elif in_flight >= limit:  # the provider's 429 comes back after a round trip
            refused += 1
            grants[client] = grant
            heapq.heappush(events, (now + 0.05, next(order), "refused", client))
        else:
            in_flight += 1
            grants[client] = grant
            heapq.heappush(events, (now + service_s, next(order), "done", client))
    return answers, refused, area / last


def test_it_settles_near_a_hidden_limit_and_turns_most_429s_into_waits():
    answers, refused, busy = run_against_a_hidden_limit(
        24, clients=40, seconds=600.0, service_s=2.0
    )
    # AIMD: cut to 0.9 × in flight, one more every 5 s; each climb past 24 costs a 429 or two.
    assert refused <= 0.02 * answers
    assert CUT * 24 - 1 <= busy <= 24


def test_it_keeps_small_hidden_limits_busy_too():
    answers, refused, busy = run_against_a_hidden_limit(3, clients=10, seconds=300.0, service_s=1.0)
    # One step of the climb is a third of the limit here: from the cut (2.7) it is past 3 again
    # in 6.5 s, about 20 answers, and then meets a 429 or two.
    assert refused <= 0.08 * answers
    assert busy >= 0.9 * 3
