"""What the experiment measures, per block and route: sums and counts, recorded as requests end.

Definitions (every one per *logical* request — a client's request, whatever it took to serve):

- ``ttft``: arrival at the gateway → first token of the answer that was served; waits for
  capacity, refused and failed attempts before it are included. Successful requests only.
  ``wait``: the part of it before the served attempt was sent (queueing for capacity and the
  attempts that failed first): the broker's and the market's share, not the provider's TTFT.
- ``throughput``: output tokens ÷ (end of the answer − arrival), end to end (G4). Successful
  requests only; the block's value is the mean over them.
- ``provider_429`` (the 429 rate): every capacity refusal the router met — each 429 a provider
  answered, retries included — ÷ logical requests. It is the production experiment's count
  (which had no broker) and the only refusal the router hears, in the gateway as here.
- ``broker_refusals``: reported beside it, not in it — each candidate the broker refused on its
  fast try during an admission pass (no room now, or a queue already waiting there), so the
  request moved on, waited, or gave up. They cost a Redis round trip, not a provider call;
  under saturation every request meets two or three of them, whichever router planned it.
- ``errors``: requests that ended with a provider error (5xx / overload after the retry budget,
  or a stream broken after its first token). ``capacity_failures``: requests refused to the
  client because no candidate had capacity before the deadline (the queue's refusal: deadline,
  deadline unreachable, queue or flow full), or because 429s used up the retry budget.
- ``over_reserved``: output tokens the served answer's lease held at its end beyond what it
  made (reserve-max: ``min(max_tokens, max_output)`` − made; in steps: first step + granted
  steps − made), per successful request; ``unreserved``: what it made beyond what its lease held
  (a stream whose next step was refused), charged at the settle. ``steps_granted`` /
  ``steps_refused``: a stream in steps' top-ups after the first, per successful request.
- ``cost``: what the provider charged for the served answer (uncached input, cached input at
  the cached price, output), per successful request. Refused and failed attempts cost nothing.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.switchback.traffic import SimRequest

SUCCESS, ERROR, CAPACITY, UNROUTABLE = "ok", "error", "capacity", "unroutable"


@dataclass(slots=True)
class SlotStats:
    """One block × route: sums and counts of the measured requests that arrived in it."""

    requests: int = 0
    served: int = 0
    errors: int = 0
    capacity_failures: int = 0
    unroutable: int = 0
    provider_429: int = 0
    broker_refusals: int = 0
    attempts: int = 0
    ttft_sum: float = 0.0
    wait_sum: float = 0.0
    throughput_sum: float = 0.0
    cost_sum: float = 0.0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0
    malformed_tool_calls: int = 0
    good_answers: int = 0  # served, and no malformed tool call in it (G1's "good answer")
    over_reserved_tokens: int = 0
    unreserved_tokens: int = 0
    steps_granted: int = 0
    steps_refused: int = 0
    ttfts: array[float] = field(default_factory=lambda: array("d"))

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__ if name != "ttfts"}
        out["ttft_p50"] = median(self.ttfts)
        return out


def median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


class Recorder:
    """Per-block, per-route measurements and a time series of where answers were served.

    ``slot_of(request)`` says which slot a request counts in (-1: not measured — warm-up,
    outside the segment's own blocks, or pinned by the client).
    """

    def __init__(
        self, *, routes: list[str], endpoints: list[str], slots: int, origin: float, bin_s: float
    ) -> None:
        self.routes = routes
        self.route_index = {name: i for i, name in enumerate(routes)}
        self.endpoint_index = {name: i for i, name in enumerate(endpoints)}
        self.slots = [SlotStats() for _ in range(slots)]
        self.origin, self.bin_s = origin, bin_s
        self.shares: dict[tuple[int, int], int] = {}  # (time bin, endpoint) → answers served
        # (slot, what) → count: which limits bind and where the answers went — the broker's
        # fast-try refusals by bucket, the providers' 429s by limit, the refused steps by
        # bucket, the answers and output tokens served per endpoint.
        self.tallies: dict[tuple[int, str], int] = {}

    def tally(self, request: SimRequest, what: str, n: int = 1) -> None:
        """Count ``n`` of ``what`` for a measured request: ``broker:<bucket or reason>``,
        ``provider:<name>:<limit>``, ``step:<bucket>``, ``answers:<endpoint>``,
        ``output:<endpoint>``, ``held:<endpoint>`` (token-seconds of output its served answers'
        leases held beyond what they had made: what reserve-max ties up and steps free)."""
        if request.slot >= 0:
            key = (request.slot, what)
            self.tallies[key] = self.tallies.get(key, 0) + n

    def end(self, request: SimRequest, kind: str) -> None:
        """A request ended without an answer."""
        if request.slot < 0:
            return
        stats = self.slots[request.slot]
        _count(stats, request)
        if kind == ERROR:
            stats.errors += 1
        elif kind == CAPACITY:
            stats.capacity_failures += 1
        else:
            stats.unroutable += 1

    def success(
        self,
        request: SimRequest,
        *,
        endpoint: str,
        now: float,
        ttft: float,
        wait: float,
        output_tokens: int,
        cached_input_tokens: int,
        cost: float,
        tool_call: bool,
        malformed: bool,
        reserved_output: int | None = None,
        steps: tuple[int, bool] = (0, False),
    ) -> None:
        key = (int((now - self.origin) // self.bin_s), self.endpoint_index[endpoint])
        self.shares[key] = self.shares.get(key, 0) + 1
        if request.slot < 0:
            return
        self.tally(request, f"answers:{endpoint}")
        self.tally(request, f"output:{endpoint}", output_tokens)
        stats = self.slots[request.slot]
        _count(stats, request)
        stats.served += 1
        stats.ttft_sum += ttft
        stats.wait_sum += wait
        stats.ttfts.append(ttft)
        stats.throughput_sum += output_tokens / (now - request.arrival)
        stats.cost_sum += cost
        stats.input_tokens += request.input_tokens
        stats.cached_input_tokens += cached_input_tokens
        stats.output_tokens += output_tokens
        stats.tool_calls += tool_call
        stats.malformed_tool_calls += malformed
        stats.good_answers += not malformed
        held = output_tokens if reserved_output is None else reserved_output
        stats.over_reserved_tokens += max(0, held - output_tokens)
        stats.unreserved_tokens += max(0, output_tokens - held)
        stats.steps_granted += steps[0]
        stats.steps_refused += steps[1]


def _count(stats: SlotStats, request: SimRequest) -> None:
    stats.requests += 1
    stats.provider_429 += request.provider_429
    stats.broker_refusals += request.broker_refusals
    stats.attempts += request.attempts
