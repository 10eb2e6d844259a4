"""What a process keeps of its ledger appends (gateway/ledger_kept.py): every record back byte
for byte and in order, each for at least the retention time and at most a slice longer."""

from __future__ import annotations

import os

from gateway.ledger_kept import SLICES, KeptRecords

SECONDS = 16.0  # slices of 1 s


def _record(n: int) -> bytes:
    return b"\x02" + os.urandom(8) + n.to_bytes(4, "big")  # deflated records do not compress


def _settlement(n: int) -> bytes:
    return b'{"outcome":"reconciled","settled":{"tenant:acme:spend":{"released":%d.5}}}' % n


def test_it_gives_back_every_record_byte_for_byte_in_the_order_kept() -> None:
    kept = KeptRecords()
    expected: list[bytes] = []
    for n in range(40):
        now = 100.0 + n * 0.25  # ten slices, the newest still filling
        if n % 3:
            head = b"\x03" + n.to_bytes(4, "big") + _record(n)
            others = [_record(1000 + n)]
            kept.keep_tailed(now, SECONDS, head, _settlement(n), others)
            expected += [head + _settlement(n), *others]
        else:
            batch = [_record(2000 + n), b"", _record(3000 + n)]  # an empty record too
            kept.keep(now, SECONDS, batch)
            expected += batch

    assert kept.records() == expected


def test_it_keeps_each_record_for_at_least_the_time_and_at_most_a_slice_longer() -> None:
    kept = KeptRecords()
    kept.keep_tailed(100.0, SECONDS, b"\x03old", _settlement(1), [b"old-generation"])
    kept.keep(100.9, SECONDS, [b"same-slice"])
    kept.keep(101.0, SECONDS, [b"next-slice"])

    kept.forget(116.9, SECONDS)  # 16.9 s after the first: its slice still holds a younger one
    assert kept.records() == [
        b"\x03old" + _settlement(1),
        b"old-generation",
        b"same-slice",
        b"next-slice",
    ]
    kept.forget(100.0 + SECONDS + SECONDS / SLICES, SECONDS)
    assert kept.records() == [b"next-slice"]
    kept.forget(118.0, SECONDS)
    assert kept.records() == [] and not kept


def test_settlements_of_a_slice_that_is_over_take_a_few_bytes_each() -> None:
    kept = KeptRecords()
    for n in range(300):
        kept.keep_tailed(100.0 + n / 1000, SECONDS, b"\x03" + _record(n), _settlement(n), [])
    kept.keep(101.0, SECONDS, [b"next"])  # the first slice is over

    [first, _] = kept._slices
    assert isinstance(first.tails, bytes) and len(first.tails) < 300 * 10
    assert first.records.size == 300 * (4 + 14)
    last = kept.records()[299]
    assert last[:2] == b"\x03\x02" and last[14:] == _settlement(299)
