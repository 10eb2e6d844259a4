"""When the broker's Redis state may stop being conservative (SPEC C9, I2): a new Redis from a
lost one, and a lost one healed by the processes that still hold its reservations.

Redis alone cannot tell "new" from "lost": both are a missing epoch, and the first script that
meets it starts a *learning period* of one maximum lease, in which buckets whose state cannot be
rebuilt from the clock (concurrency, fixed and rolling windows) refuse with ``recovering``.
The deployment knows more. Every process that can hold reservations is a *member*: a durable
row (PostgreSQL) it heartbeats. After a loss each live member *reports*: it re-registers the
reservations it still holds in the new Redis (no capacity check: they are already out), then
says so in the epoch. A new process has nothing to re-register and reports before it registers,
so a reader who sees its row also sees its report.

A reservation of the lost state can still be in flight only in a member that
- is live (seen within ``live_seconds``) and has not reported: wait for it (a few heartbeats);
- was seen within one lease of the loss and is not live: it stopped renewing by about
  ``last_seen + live_seconds``, or by the loss, whichever came first, so what it held is over
  one maximum lease later.
When neither remains the period ends, at once for a new deployment (no members, or only new
ones) and within seconds after a loss while the processes live; never later than the epoch's
own end (born + max lease), which needs no membership at all.

Pure: no clock of its own (``now`` is an argument), no Django, no Redis.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

HEARTBEAT_SECONDS = 1.0  # how often a member writes its row and looks at the epoch
LIVE_SECONDS = 3.0  # a member not seen for this long is taken for stopped
# A live member notices a loss and reports within about two heartbeats: the expected end of a
# recovery still waiting for reports (what ``Retry-After`` says), if nothing later binds it.
REPORT_SECONDS = 2 * HEARTBEAT_SECONDS


@dataclass(frozen=True, slots=True)
class Member:
    """A process that can hold reservations, as its row says (times on the Redis clock)."""

    id: str
    started: float
    last_seen: float


@dataclass(frozen=True, slots=True)
class Epoch:
    """The store's ``born`` (when the state began) and ``until`` (end of the learning period)."""

    born: float
    until: float

    def learning(self, now: float) -> bool:
        return now < self.until


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the members say about a learning epoch.

    ``ends_at``: when the learning period may end (≤ now: at once), or None while live members
    have still to report (``waiting_for``). ``expected_end``: the best guess of the end, for
    ``Retry-After``. ``born``: the epoch's birth as far as refill buckets need to know — the last
    moment anything could have taken from them (0 when nothing ever ran): a bucket whose state is
    missing counts as empty then, full a period later. ``lost``: a member was running when the
    state began, so reservations may have been in flight (else the store is simply new).
    """

    ends_at: float | None
    expected_end: float
    born: float
    waiting_for: tuple[str, ...]
    lost: bool


def _live(member: Member, now: float, live_seconds: float) -> bool:
    return now - member.last_seen <= live_seconds


def holds_until(member: Member, born: float, max_lease: float, live_seconds: float) -> float:
    """The latest end of any lease of the lost state that a stopped, silent member held: it
    renewed nothing after it stopped (≈ its last heartbeat + ``live_seconds``) nor, in the lost
    Redis, after the loss (``born``)."""
    return min(born, member.last_seen + live_seconds) + max_lease


def recovery_decide(
    epoch: Epoch,
    members: Iterable[Member],
    reported: Collection[str],
    *,
    now: float,
    max_lease: float,
    live_seconds: float = LIVE_SECONDS,
    report_seconds: float = REPORT_SECONDS,
) -> Verdict:
    """Decide a learning epoch from the members' rows and the reports in the epoch."""
    members = list(members)
    if not epoch.learning(now):
        return Verdict(epoch.until, epoch.until, epoch.born, (), False)
    born = epoch.born
    # Members that ran before the state began: only they can hold reservations of the old one.
    old = [m for m in members if m.started < born]
    waiting = tuple(
        sorted(m.id for m in members if m.id not in reported and _live(m, now, live_seconds))
    )
    silent = [
        holds_until(m, born, max_lease, live_seconds)
        for m in old
        if m.id not in reported and not _live(m, now, live_seconds)
    ]
    in_flight_until = max(silent, default=now)
    # A reported member was running at the loss; a silent one until it stopped, at most.
    activity = [born if m.id in reported else min(born, m.last_seen + live_seconds) for m in old]
    refill_born = min(born, max(activity, default=0.0))
    lost = any(a + max_lease > born for a in activity)
    if waiting:
        expected = min(epoch.until, max(now + report_seconds, in_flight_until))
        return Verdict(None, expected, refill_born, waiting, lost)
    ends_at = min(epoch.until, max(now, in_flight_until))
    return Verdict(ends_at, ends_at, refill_born, (), lost)
