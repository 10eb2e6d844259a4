"""Where capacity is left (issue 17 item 3): the expected wait for capacity at each endpoint.

The broker answers every reservation it refuses with the time the request could next fit
(``retry_at``: the latest fit time of the refill buckets that refused it, its queue's next fit
when others wait ahead). Admission hands that answer to the router as plain data — the routing
core knows nothing of the quota core — with the size of the request it refused (its input
tokens); a grant says the endpoint has room again:

    (free_at_e, size_e) = the broker's last "not before" for endpoint e, and for what size
                          (a grant since: none)
    w_e(now, I) = max(0, free_at_e − now)   if I ≥ size_e       expected wait for capacity, s
                = 0                          if I < size_e       (unknown: a smaller one may fit)

The size matters: one large prompt refused until a token bucket or a rolling spend window has
room for it says nothing of a small one, and a view that kept every request of the model away
would never hear of the room that comes back (no request would try). A smaller request that is
refused too makes the view hold for its size and up. No extra broker call: the view is what
this process's own admissions already heard, kept per endpoint (a model's requests ask one
size of its provider's buckets). A refusal by a concurrency limit says nothing of when a slot
frees (a release may come any moment), so admission passes no wait for it.

In the routing cost (``planner``; routing-cost strategy only, price-only is the baseline):

    cost_e += λ · w_e                                          waiting for capacity is waiting

and with the request's deadline D (its workload's, from arrival):

    w_e > D for some e                 e is left out of the plan ("capacity_wait")
    w_e > D for every candidate e      the request is refused before any broker call, naming
                                       the endpoint with room first (argmin w_e) and when
"""

from __future__ import annotations


class CapacityView:
    """Per endpoint id: when the broker last said it would next have room, and for a request of
    which size (input tokens); pure: no clock."""

    __slots__ = ("free_at",)

    def __init__(self) -> None:
        self.free_at: dict[str, tuple[float, float]] = {}  # endpoint → (free_at, size)

    def full(self, endpoint_id: str, free_at: float, now: float, size: float = 0.0) -> None:
        """The broker refused a request of ``size`` input tokens at ``endpoint_id``: a request
        that large fits again at ``free_at``."""
        if free_at > now:
            self.free_at[endpoint_id] = (free_at, size)
        else:
            self.free_at.pop(endpoint_id, None)

    def room(self, endpoint_id: str) -> None:
        """The broker granted a request at ``endpoint_id``: it has room now."""
        self.free_at.pop(endpoint_id, None)

    def wait(self, endpoint_id: str, now: float, size: float = 0.0) -> float:
        """w_e: seconds until ``endpoint_id`` is expected to have room for a request of ``size``
        input tokens (0: it has, or nothing is known for that size)."""
        seen = self.free_at.get(endpoint_id)
        if seen is None:
            return 0.0
        free_at, refused_size = seen
        if free_at <= now:
            del self.free_at[endpoint_id]  # the wait is over: the next refusal says anew
            return 0.0
        return free_at - now if size >= refused_size else 0.0


def capacity_costs(costs: list[float], waits: list[float], lam: float) -> list[float]:
    """cost_e + λ·w_e for each candidate (module docstring)."""
    return [c + lam * w for c, w in zip(costs, waits, strict=True)]


def capacity_refusal(
    ids: list[str], waits: list[float], deadline_s: float
) -> tuple[list[int], tuple[str, float] | None]:
    """(positions to keep, refusal): endpoints whose wait passes the deadline are left out;
    when that is every one, the refusal names the endpoint with room first and its wait."""
    keep = [k for k, w in enumerate(waits) if w <= deadline_s]
    if keep or not waits:
        return keep, None
    best = min(range(len(waits)), key=lambda k: waits[k])
    return [], (ids[best], waits[best])
