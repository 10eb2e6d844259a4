"""The fair queue's pure core on a simulated clock: weights hold in long backlogged runs, burst
credit is bounded, unused capacity goes to others, deadlines are never passed, the tags
of those behind a waiter that leaves do not move, and a tenant's apps share its flow's turn
without holding each other back. Time is an argument; nothing sleeps."""

from __future__ import annotations

import copy
import random
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas.core.book import Book
from quotas.core.fairqueue import (
    DRAIN_MARGIN,
    MAILBOX_ALIVE_SECONDS,
    Queued,
    QueueReason,
    QueueRefusal,
    drain_floor,
    jain_index,
    start_tag,
    weighted_max_min,
)
from quotas.core.model import BucketSpec, Dimension, Grant, Rule, Usage
from quotas.core.queuebook import QueueBook

T0 = 1_700_000_000.0
POOL = "provider:alpha"
RATE = 10_000.0  # pool tokens per second
TPM = BucketSpec("alpha-tpm", POOL, Dimension.TOTAL_TOKENS, Rule.REFILL, RATE, 1.0)


@dataclass
class Flow:
    weight: float
    costs: tuple[int, int]  # request size range, tokens
    depth: int = 4  # keep this many waiting while active
    active: tuple[float, float] = (0.0, 1e9)  # seconds after T0
    served: list[tuple[float, float]] = field(default_factory=list)  # (time, tokens)


@dataclass
class Run:
    qb: QueueBook
    flows: dict[str, Flow]
    seq: int = 0

    def tokens(self, name: str, start: float, end: float) -> float:
        return sum(n for t, n in self.flows[name].served if start <= t - T0 < end)


def simulate(flows: dict[str, Flow], *, seconds: float, burst: float, seed: int = 0) -> Run:
    """Every flow keeps ``depth`` requests waiting while active; the pump runs every 10 ms."""
    rng = random.Random(seed)
    run = Run(QueueBook(Book()), flows)
    sizes: dict[str, float] = {}
    step = 0.01
    for k in range(int(seconds / step)):
        now = T0 + k * step
        for name, flow in flows.items():
            if not flow.active[0] <= now - T0 < flow.active[1]:
                continue
            pq = run.qb.pools.get(POOL)
            while pq is None or len(pq.flows.get(name, ())) < flow.depth:
                run.seq += 1
                rid = f"{name}-{run.seq}"
                size = rng.randint(*flow.costs)
                sizes[rid] = size
                result = run.qb.enter(
                    rid,
                    [TPM],
                    Usage(input_tokens=size),
                    pool=POOL,
                    flow=name,
                    weight=flow.weight,
                    deadline=now + 1e6,
                    max_depth=10_000,
                    flow_depth=1000,
                    lease_seconds=60,
                    burst=burst,
                    mailbox="m",
                    now=now,
                )
                assert isinstance(result, Queued | Grant), result
                if isinstance(result, Grant):
                    flow.served.append((now, size))
                pq = run.qb.pools[POOL]
        run.qb.pump(POOL, now=now)
        for rid, verdict in run.qb.take_mail("m"):
            assert isinstance(verdict, Grant)
            flows[rid.split("-")[0]].served.append((verdict.created_at, sizes[rid]))
    return run


weights = st.sampled_from([1.0, 2.0, 4.0, 8.0])


@settings(max_examples=12, deadline=None)
@given(ws=st.lists(weights, min_size=2, max_size=4), seed=st.integers(0, 1000))
def test_it_serves_backlogged_flows_in_proportion_to_their_weights(ws, seed):
    flows = {f"f{i}": Flow(w, (50, 400)) for i, w in enumerate(ws)}
    run = simulate(flows, seconds=8, burst=0.0, seed=seed)
    total = sum(run.tokens(n, 0, 8) for n in flows)
    assert total >= RATE * 8 * 0.98  # the pool never idles while someone waits
    # Start-time fair queuing's bound: while both are backlogged (all are, once all joined at
    # the start), normalised service differs by at most one request each.
    for a in flows:
        for b in flows:
            gap = run.tokens(a, 0.5, 8) / flows[a].weight - run.tokens(b, 0.5, 8) / flows[b].weight
            assert gap <= 400 / flows[a].weight + 400 / flows[b].weight + 1e-6


def test_it_holds_weight_ratios_within_five_percent_over_a_long_run():
    flows = {"one": Flow(1, (100, 1000)), "two": Flow(2, (100, 1000)), "four": Flow(4, (100, 1000))}
    run = simulate(flows, seconds=60, burst=4000.0, seed=7)
    got = {n: run.tokens(n, 5, 60) for n in flows}
    fair = weighted_max_min(
        sum(got.values()), {n: 1e12 for n in flows}, {n: f.weight for n, f in flows.items()}
    )
    for n in flows:
        assert abs(got[n] / fair[n] - 1) <= 0.05, (n, got, fair)
    assert jain_index([got[n] / fair[n] for n in flows]) >= 0.999


@settings(max_examples=10, deadline=None)
@given(
    burst=st.sampled_from([0.0, 400.0, 1000.0]),
    w=weights,
    idle=st.floats(2.5, 4.0),
    seed=st.integers(0, 1000),
)
def test_it_bounds_the_burst_credit_of_a_returning_tenant(burst, w, idle, seed):
    flows = {
        "back": Flow(w, (50, 300), active=(idle, 1e9)),
        "busy": Flow(w, (50, 300)),
        "other": Flow(w, (50, 300)),
    }
    run = simulate(flows, seconds=idle + 3, burst=burst, seed=seed)
    # From its return on, the returning tenant is ahead of a continuously busy one by at most
    # its burst (plus one request each), however long it was away.
    ahead = max(
        (run.tokens("back", idle, idle + d) - run.tokens("busy", idle, idle + d)) / w
        for d in (0.25, 0.5, 1, 2, 3)
    )
    assert ahead <= (burst + 300 + 300) / w + 1e-6
    # ... and it does get that burst (served alone until it is used up). The others, busy
    # since the start, have used up their own first credit by now (0.2 s at 5000 tokens/s).
    got = run.tokens("back", idle, idle + 3) - run.tokens("busy", idle, idle + 3)
    assert got >= min(burst, RATE * 3) - 2 * 300


def enter(qb: QueueBook, rid: str, flow: str, size: float, now: float, **kw) -> object:
    args = dict(
        pool=POOL,
        flow=flow,
        weight=1.0,
        deadline=now + 60,
        max_depth=10_000,
        flow_depth=100,
        lease_seconds=60,
        burst=0.0,
        mailbox="m",
        now=now,
    )
    args.update(kw)
    return qb.enter(rid, [TPM], Usage(input_tokens=size), **args)


def test_it_gives_capacity_an_idle_or_light_tenant_does_not_use_to_the_others():
    qb, served = QueueBook(Book()), defaultdict(list)
    for k in range(1000):  # 10 s in 10 ms steps
        now = T0 + k * 0.01
        # 'light' asks for 10 % of the pool: 100 tokens every 10 ms.
        if k % 10 == 0 and isinstance(enter(qb, f"light-{k}", "light", 100, now), Grant):
            served["light"].append((now, 100))
        while len(qb.pools[POOL].flows.get("noisy", ())) < 20:  # 'noisy' asks for far more
            if isinstance(enter(qb, f"noisy-{k}-{len(served['n'])}", "noisy", 150, now), Grant):
                served["noisy"].append((now, 150))
            served["n"].append(1)
        qb.pump(POOL, now=now)
        for rid, verdict in qb.take_mail("m"):
            name = rid.split("-")[0]
            served[name].append((verdict.created_at, 100 if name == "light" else 150))
            if name == "light":
                # Its turn comes at once: it waits at most for the pool to refill 100 tokens.
                assert verdict.created_at - T0 - int(rid.split("-")[1]) * 0.01 <= 0.02
    light = sum(n for t, n in served["light"] if t - T0 >= 1)
    noisy = sum(n for t, n in served["noisy"] if t - T0 >= 1)
    assert light == 100 * 90  # every light request
    # What light and the idle tenant did not use went to noisy: the pool never idled.
    assert light + noisy >= RATE * 9 * 0.98


@settings(max_examples=25, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.floats(0, 0.5), st.integers(0, 3), st.integers(10, 600), st.floats(0.05, 3)),
        min_size=5,
        max_size=60,
    )
)
def test_it_never_grants_after_a_deadline_nor_beyond_capacity(ops):
    qb = QueueBook(Book())
    now, deadlines, granted = T0, {}, []
    for i, (gap, who, size, patience) in enumerate(ops):
        now += gap
        deadlines[f"r{i}"] = now + patience
        r = enter(
            qb,
            f"r{i}",
            f"t{who}",
            size,
            now,
            weight=who + 1,
            deadline=now + patience,
            max_depth=8,
            flow_depth=3,
            burst=500,
        )
        if isinstance(r, Grant):
            granted.append((r.reservation_id, r.created_at, size))
        qb.pump(POOL, now=now)
        for rid, v in qb.take_mail("m"):
            if isinstance(v, Grant):
                granted.append((rid, v.created_at, v.parts[0].amount))
            else:
                assert v.reason in set(QueueReason) and v.retry_at >= v.at
    for rid, at, _ in granted:
        assert at < deadlines[rid]
    # A refill bucket of C per P never hands out more than C + elapsed·C/P.
    total = sum(size for _, _, size in granted)
    assert total <= TPM.capacity + (now - T0) * RATE + 1e-6
    # Pumping past every deadline leaves no waiter behind.
    qb.pump(POOL, now=now + 10)
    assert not qb.pools[POOL].entries


def test_it_does_not_move_the_tags_of_those_behind_a_waiter_that_leaves():
    qb = QueueBook(Book())
    enter(qb, "x0", "a", RATE, T0, weight=2.0)
    for i in range(1, 4):
        enter(qb, f"x{i}", "a", 100, T0, weight=2.0)
    assert isinstance(qb.leave(POOL, "x2", reason=QueueReason.CANCELLED, now=T0), QueueRefusal)
    qb.pump(POOL, now=T0 + 1)
    assert sorted(rid for rid, _ in qb.take_mail("m")) == ["x1", "x3"]
    # Only what was granted counts: 10000 + 100 + 100 tokens at weight 2.
    assert qb.pools[POOL].finish["a"] == 5100.0


def app_limit(name: str, per_second: float) -> BucketSpec:
    return BucketSpec(f"{name}-rps", f"app:{name}", Dimension.REQUESTS, Rule.REFILL, per_second, 1)


def test_it_gives_a_tenant_of_many_apps_no_more_of_the_pool_than_a_tenant_of_one():
    """'many' has five backlogged apps (the first one's own limit lets it two requests a
    second), 'one' a single app; equal weights, the pool is contended. Each tenant gets half:
    the apps share their tenant's turn (no more), and one held by its own limit does not make
    its tenant lose its turn (no less)."""
    qb, served, waiting = QueueBook(Book()), defaultdict(float), defaultdict(set)
    apps = {f"m{k}": "many" for k in range(5)} | {"o": "one"}
    limits = {name: app_limit(name, 2.0 if name == "m0" else 1e6) for name in apps}
    sizes: dict[str, int] = {}
    rng, seq = random.Random(3), 0
    for k in range(800):  # 8 s in 10 ms steps
        now = T0 + k * 0.01
        for name, tenant in apps.items():
            while len(waiting[name]) < 4:
                seq += 1
                rid, size = f"{name}-{seq}", rng.randint(50, 400)
                r = qb.enter(
                    rid, [limits[name], TPM], Usage(input_tokens=size), pool=POOL, flow=tenant,
                    weight=1.0, deadline=now + 1e6, max_depth=10_000, flow_depth=1000,
                    lease_seconds=60, burst=0.0, mailbox="m", now=now,
                )  # fmt: skip
                sizes[rid] = size
                if isinstance(r, Grant):
                    served[tenant] += size * (now - T0 >= 0.5)
                else:
                    waiting[name].add(rid)
        qb.pump(POOL, now=now)
        for rid, verdict in qb.take_mail("m"):
            assert isinstance(verdict, Grant)
            name = rid.split("-")[0]
            waiting[name].discard(rid)
            served[apps[name]] += sizes[rid] * (verdict.created_at - T0 >= 0.5)
    assert served["many"] + served["one"] >= RATE * 7.5 * 0.98  # the pool never idled
    # Start-time fair queuing's bound between two backlogged flows: one request each.
    assert abs(served["many"] - served["one"]) <= 400 + 400, dict(served)


def _check_lanes(qb: QueueBook) -> None:
    """Each flow has one head, the first waiter of the first lane of its ring, unless all its
    lanes are parked; a lane with waiters is either in the ring or parked, never both."""
    pq = qb.pools[POOL]
    heads = set(pq.head_of)
    assert len(heads) == len(pq.heads)
    for name, flow in pq.flows.items():
        assert flow.size == sum(len(q) for q in flow.lanes.values()) > 0
        assert all(flow.lanes.values()) and len(set(flow.ring)) == len(flow.ring)
        for lane in flow.lanes:
            assert (lane in flow.ring) != (f"{name}\x1f{lane}" in pq.parked)
        waiting = {e.reservation_id for q in flow.lanes.values() for e in q}
        if flow.ring:
            assert heads & waiting == {flow.lanes[flow.ring[0]][0].reservation_id}
        else:
            assert not heads & waiting
    assert sum(f.size for f in pq.flows.values()) == len(pq.entries)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.floats(0, 0.3),  # seconds since the previous step
            st.sampled_from(["enter", "enter", "enter", "pump", "leave"]),
            st.sampled_from(["a", "b"]),  # tenant
            st.integers(0, 3),  # its app (3: none of its own)
            st.integers(100, 1500),  # input tokens
        ),
        min_size=10,
        max_size=80,
    )
)
def test_it_keeps_one_head_per_flow_from_the_first_lane_not_parked(ops):
    qb = QueueBook(Book())
    pool = BucketSpec("alpha-small", POOL, Dimension.INPUT_TOKENS, Rule.REFILL, 3000, 10)
    limits = {  # two apps allowed one request in 3 s and in 1 s, one app without a limit
        k: BucketSpec(f"x{k}-rp", f"app:x{k}", Dimension.REQUESTS, Rule.REFILL, [1, 1, 1e6][k], p)
        for k, p in enumerate([3.0, 1.0, 1.0])
    }
    now, rids = T0, []
    for i, (gap, op, tenant, k, size) in enumerate(ops):
        now += gap
        if op == "enter":
            buckets = [pool] if k == 3 else [limits[k], pool]
            rid = f"{tenant}{k}-{i}"
            rids.append(rid)
            qb.enter(
                rid, buckets, Usage(input_tokens=size), pool=POOL, flow=tenant, weight=1.0,
                deadline=now + [1.0, 5.0, 30.0][i % 3], max_depth=12, flow_depth=8,
                lease_seconds=60, burst=0.0, mailbox="m", now=now,
            )  # fmt: skip
        elif op == "pump":
            qb.pump(POOL, now=now)
        elif rids:
            qb.leave(POOL, rids[size % len(rids)], reason=QueueReason.CANCELLED, now=now)
        if POOL in qb.pools:
            _check_lanes(qb)


SLOT = BucketSpec("alpha-conc", POOL, Dimension.CONCURRENCY, Rule.CONCURRENCY, 1)
SLOW = BucketSpec("alpha-slow", POOL, Dimension.INPUT_TOKENS, Rule.REFILL, 1000, 10)  # 100/s


def _held_slot_with_two_waiters() -> tuple[QueueBook, Grant]:
    """One slot, held; the waiter of mailbox 'dead' is first in line, then 'live''s."""
    qb = QueueBook(Book(), alive_seconds=MAILBOX_ALIVE_SECONDS)
    kw: dict[str, Any] = dict(pool=POOL, weight=1.0, deadline=T0 + 600, max_depth=10)
    kw.update(flow_depth=10, lease_seconds=30, burst=0.0)
    held = qb.enter("h", [SLOT], Usage(), flow="a", mailbox="live", now=T0, **kw)
    assert isinstance(held, Grant)
    for rid, mailbox in (("d1", "dead"), ("l1", "live")):
        assert isinstance(
            qb.enter(rid, [SLOT], Usage(), flow=rid, mailbox=mailbox, now=T0, **kw), Queued
        )
    return qb, held


def test_it_skips_a_dead_mailboxs_waiter_and_gives_the_next_the_capacity_at_once():
    qb, held = _held_slot_with_two_waiters()
    qb.keep_alive("live", now=T0 + 4)  # 'live''s listener reads; 'dead''s process has died
    # The slot comes back after 'dead''s mark (T0 + 5): the same step hands it to l1.
    _, pumped = qb.settle(held, None, pool=POOL, now=T0 + 6)
    assert pumped is not None and (pumped.granted, pumped.refused, pumped.depth) == (1, 1, 0)
    [(rid, grant)] = qb.take_mail("live")
    assert rid == "l1" and isinstance(grant, Grant) and grant.created_at == T0 + 6
    [(rid, told)] = qb.take_mail("dead")
    assert rid == "d1" and isinstance(told, QueueRefusal)
    assert (told.reason, told.queue_id, told.retry_at) == (QueueReason.ABANDONED, "d1", T0 + 6)
    assert qb.book.levels([SLOT], now=T0 + 6)[0].available == 0  # l1's slot; d1 took nothing


def test_it_does_not_skip_a_live_but_slow_reader_within_its_mark():
    qb, held = _held_slot_with_two_waiters()
    qb.keep_alive("dead", now=T0 + 2)  # it last read 4 s before the slot comes back
    qb.settle(held, None, pool=POOL, now=T0 + 6.99)
    assert [rid for rid, _ in qb.take_mail("dead")] == ["d1"]
    assert qb.is_alive("dead", T0 + 6.99) and not qb.is_alive("dead", T0 + 7)


def test_it_treats_every_mailbox_as_alive_when_liveness_is_off():
    qb = QueueBook(Book())
    enter(qb, "x0", "a", RATE, T0)
    enter(qb, "x1", "b", 100, T0)
    qb.pump(POOL, now=T0 + 100)  # nobody marked 'm' for 100 s: a simulation's one mailbox
    assert [rid for rid, _ in qb.take_mail("m")] == ["x1"]


@settings(max_examples=25, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.floats(0, 2), st.sampled_from("pqr"), st.booleans(), st.integers(10, 500)),
        min_size=15,
        max_size=60,
    )
)
def test_it_never_grants_a_waiter_whose_mailbox_went_unread_and_keeps_those_read(ops):
    qb = QueueBook(Book(), alive_seconds=MAILBOX_ALIVE_SECONDS)
    now, depth, marked, owner = T0, 0, {}, {}

    def read_mail() -> None:
        for m in "pqr":
            for rid, v in qb.take_mail(m):
                assert owner[rid] == m
                alive = marked[m] + MAILBOX_ALIVE_SECONDS > now
                if isinstance(v, Grant):
                    assert alive  # capacity only to a mailbox someone reads
                elif v.reason is QueueReason.ABANDONED:
                    assert not alive

    for i, (gap, mailbox, reads, size) in enumerate(ops):
        now += gap
        if mailbox == "r" and i >= 10:
            mailbox = "p"  # 'r''s process died after its first ten steps
        owner[f"r{i}"] = mailbox
        entered = qb.enter(
            f"r{i}",
            [SLOW],
            Usage(input_tokens=size),
            pool=POOL,
            flow=f"t{i % 3}",
            weight=1.0,
            deadline=now + 60,
            max_depth=100,
            flow_depth=100,
            lease_seconds=30,
            burst=0.0,
            mailbox=mailbox,
            now=now,
        )
        if depth > 0 or isinstance(entered, Queued):
            # It joined the line (behind others, or to wait): its process is alive, and the
            # pump inside enter already sees it so.
            marked[mailbox] = now
        read_mail()  # the verdicts of the pump inside enter, given the marks as they were
        for m in "pqr":
            if reads and m != "r":  # 'r' never reads its mail; the others do at times
                qb.keep_alive(m, now=now)
                marked[m] = now
        depth = qb.pump(POOL, now=now).depth
        read_mail()


def test_it_lets_a_returning_flow_lag_virtual_time_by_its_burst_only():
    assert start_tag(1000.0, 10.0, 800.0, 4.0) == 800.0  # long idle: credit is burst / weight
    assert start_tag(1000.0, 950.0, 800.0, 4.0) == 950.0  # little lag: no extra credit
    assert start_tag(1000.0, 1200.0, 800.0, 4.0) == 1200.0  # ahead: waits its turn


def test_it_computes_jain_and_weighted_max_min_shares():
    assert jain_index([1, 1, 1, 1]) == 1.0
    assert jain_index([1, 0, 0, 0]) == 0.25
    shares = weighted_max_min(100, {"a": 1000, "b": 10, "c": 1000}, {"a": 1, "b": 1, "c": 3})
    assert shares == {"a": 22.5, "b": 10, "c": 67.5}


def test_it_keeps_the_queue_core_free_of_django_and_redis():
    code = (
        "import sys, quotas.core.fairqueue, quotas.core.queuebook; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'redis')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


@pytest.mark.parametrize("fair", [True, False])
def test_it_holds_a_noisy_tenant_to_its_share_where_one_fifo_would_not(fair):
    """A offers 9× its share, B and C 60 % of theirs. Negative control: the same load through
    one FIFO flow (every tenant in one flow) starves B and C, so the check can fail."""
    qb, offered, granted = QueueBook(Book()), defaultdict(int), defaultdict(int)
    rates = {"a": 3.0, "b": 0.2, "c": 0.2}  # requests of 100 tokens per 10 ms step
    owed, counted, seq = defaultdict(float), set(), 0
    for k in range(1000):  # 10 s; the pool serves 100 requests/s; count arrivals from 2 s on
        now = T0 + k * 0.01
        for name, rate in rates.items():
            owed[name] += rate
            while owed[name] >= 1:
                owed[name] -= 1
                seq += 1
                rid = f"{name}-{seq}"
                if k >= 200:
                    offered[name] += 1
                    counted.add(rid)
                r = enter(
                    qb,
                    rid,
                    name if fair else "all",
                    100,
                    now,
                    deadline=now + 1.0,
                    max_depth=400,
                    flow_depth=50 if fair else 400,
                )
                granted[name] += isinstance(r, Grant) and rid in counted
        qb.pump(POOL, now=now)
        for rid, verdict in qb.take_mail("m"):
            granted[rid.split("-")[0]] += isinstance(verdict, Grant) and rid in counted
    share = {name: granted[name] / offered[name] for name in rates}
    if fair:
        assert share["b"] >= 0.9 and share["c"] >= 0.9, share
        # ... and the pool was kept busy: all but A's last 50 waiters (its flow depth) served.
        assert sum(granted.values()) >= 100 * 8 - 50 - 5
    else:
        assert share["b"] < 0.5 and share["c"] < 0.5, share


# -- foreseeing a queue's drain (E6) -------------------------------------------------------


def test_it_adds_up_the_waiters_ahead_and_names_the_bucket_that_binds():
    # Two buckets: 100 requests... of which 1 left, 1/s; 500 tokens left, 100/s.
    levels = [(1.0, 1.0), (500.0, 100.0)]
    ahead = [(T0 + 100, [1.0, 400.0]), (T0 + 100, [1.0, 400.0])]
    # Tokens: 400 + 400 + 300 − 500 short = 6 s; requests: 3 − 1 = 2 s.
    assert drain_floor(ahead, [1.0, 300.0], levels, T0) == (pytest.approx(T0 + 6), 1)
    # Nothing ahead, and it fits: now, no bucket.
    assert drain_floor([], [1.0, 300.0], levels, T0) == (T0, -1)


def test_it_leaves_out_a_waiter_ahead_that_cannot_fit_before_its_own_deadline():
    levels = [(0.0, 100.0)]
    ahead = [(T0 + 100, [500.0]), (T0 + 3, [400.0]), (T0 + 100, [100.0])]
    # The second needs 9 s behind the first: it leaves at its deadline, having taken nothing.
    assert drain_floor(ahead, [100.0], levels, T0)[0] == pytest.approx(T0 + 7)


ITPM = BucketSpec("alpha-itpm", POOL, Dimension.INPUT_TOKENS, Rule.REFILL, 1000.0, 10.0)
RPM = BucketSpec("alpha-rpm", POOL, Dimension.REQUESTS, Rule.REFILL, 6.0, 6.0)


def _waits_in_vain(qb: QueueBook, rid: str, size: int, deadline: float, now: float) -> bool:
    """Had ``rid`` waited (in a copy of the queue, nothing new arriving, every grant kept in
    full), would it still not have been granted before its deadline (less ``DRAIN_MARGIN``)?"""
    qb = copy.deepcopy(qb)
    qb._drain_refusal = lambda *args: None  # type: ignore[method-assign]
    result = qb.enter(
        rid, [ITPM, RPM], Usage(input_tokens=size), pool=POOL, flow="a", weight=1.0,
        deadline=deadline, max_depth=1000, flow_depth=1000, lease_seconds=600, burst=0.0,
        mailbox="m", now=now,
    )  # fmt: skip
    last = deadline - DRAIN_MARGIN
    if not isinstance(result, Queued):
        return not (isinstance(result, Grant) and result.created_at < last)
    while now < deadline:
        pumped = qb.pump(POOL, now=now)
        mail = qb.take_mail("m")
        if any(r == rid and isinstance(v, Grant) and v.created_at < last for r, v in mail):
            return False
        now = max(now + 1e-3, min(pumped.next_fit, deadline))
    return True


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.1, 0.5, 2.0]),  # seconds since the previous arrival
            st.integers(10, 900),  # input tokens
            st.sampled_from([1.0, 4.0, 10.0, 30.0]),  # deadline, seconds after arrival
        ),
        min_size=5,
        max_size=60,
    )
)
def test_it_refuses_early_only_whom_waiting_could_not_have_served(arrivals):
    """One tenant's line on input tokens and requests: an early refusal by the queue's drain
    is never wrong — the same request, had it waited, would not have been granted in time."""
    qb = QueueBook(Book())
    now, told = T0, 0
    for i, (gap, size, wait) in enumerate(arrivals):
        now += gap
        qb.pump(POOL, now=now)
        qb.take_mail("m")
        rid = f"r{i}"
        before = copy.deepcopy(qb)
        result = qb.enter(
            rid, [ITPM, RPM], Usage(input_tokens=size), pool=POOL, flow="a", weight=1.0,
            deadline=now + wait, max_depth=1000, flow_depth=1000, lease_seconds=600,
            burst=0.0, mailbox="m", now=now,
        )  # fmt: skip
        early = (
            isinstance(result, QueueRefusal)
            and result.reason is QueueReason.DEADLINE_UNREACHABLE
            and not result.refusals
        )
        if early:
            told += 1
            # The line drains past the deadline, less the margin that judges a fit at the very
            # instant of the deadline too late (the waiter's timer and the pump would race).
            assert result.retry_at > now + wait - DRAIN_MARGIN
            assert _waits_in_vain(before, rid, size, now + wait, now)
