"""What a gateway process appended to the ledger lately, kept to append again should Redis
restart empty before the flush stores it (gateway/ledger.py), in as little memory as it takes.

Kept as Python objects (a tuple and a list an append, a bytes object a record), 15 s of answers
took ~1.6 KB an answer at 64 connections, most of it the settlement a carried reservation
record ends with: the settle script's JSON of every bucket's name, released and charged (~900
bytes, the same bucket names answer after answer). So records are kept as bytes in one buffer
per time slice (length-prefixed), a carried record's settlement (its "tail") apart in a second
buffer deflated once its slice is over (~60 to 1: ~15 bytes a settlement, ~1 µs of CPU an
answer), and a slice is let go whole once all of it is old enough: each record is kept for at
least ``seconds``, at most a slice longer.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterable

SLICES = 16  # slices per retention time: records outlive ``seconds`` by at most 1/16 of it
_SIZE = 4  # bytes of each length prefix
_TAILED = 1 << 31  # set in a record's length prefix: its tail is in the slice's tails


class _Slice:
    __slots__ = ("records", "start", "tails")

    def __init__(self, start: float) -> None:
        self.start = start
        self.records = bytearray()  # each record: its length, then the record (its head)
        # the tails of the records that have one, in their order: length-prefixed while the
        # slice fills, deflated (bytes) once it is over
        self.tails: bytearray | bytes = bytearray()


class KeptRecords:
    """Records appended at a time, kept for at least ``seconds`` after it, oldest first."""

    def __init__(self) -> None:
        self._slices: deque[_Slice] = deque()

    def __bool__(self) -> bool:
        return bool(self._slices)

    def keep(self, now: float, seconds: float, records: Iterable[bytes]) -> None:
        """Keep ``records``, appended at ``now``; let go of what is older than ``seconds``."""
        into = self._slice(now, seconds).records
        for record in records:
            into += len(record).to_bytes(_SIZE, "big")
            into += record

    def keep_tailed(
        self, now: float, seconds: float, head: bytes, tail: bytes, others: list[bytes]
    ) -> None:
        """Keep the record ``head + tail``, whose ``tail`` is much like the tails of the records
        kept about the same time (a carried reservation record's settlement), then ``others``."""
        kept = self._slice(now, seconds)
        into = kept.records
        into += (_TAILED | len(head)).to_bytes(_SIZE, "big")
        into += head
        tails = kept.tails
        assert isinstance(tails, bytearray)  # the newest slice is never deflated yet
        tails += len(tail).to_bytes(_SIZE, "big")
        tails += tail
        for other in others:
            into += len(other).to_bytes(_SIZE, "big")
            into += other

    def forget(self, now: float, seconds: float) -> None:
        """Let go of every slice whose records are all older than ``seconds``."""
        slices = self._slices
        while slices and slices[0].start + seconds / SLICES <= now - seconds:
            slices.popleft()

    def records(self) -> list[bytes]:
        """Every record kept, oldest first, byte for byte as it was appended."""
        out: list[bytes] = []
        for kept in self._slices:
            tails = kept.tails
            if isinstance(tails, bytes) and tails:
                tails = zlib.decompress(tails)
            data, at, tail_at = kept.records, 0, 0
            while at < len(data):
                size = int.from_bytes(data[at : at + _SIZE], "big")
                start = at + _SIZE
                at = start + (size & ~_TAILED)
                record = bytes(data[start:at])
                if size & _TAILED:
                    length = int.from_bytes(tails[tail_at : tail_at + _SIZE], "big")
                    tail_at += _SIZE + length
                    record += tails[tail_at - length : tail_at]
                out.append(record)
        return out

    def _slice(self, now: float, seconds: float) -> _Slice:
        self.forget(now, seconds)
        slices = self._slices
        if slices and now < slices[-1].start + seconds / SLICES:
            return slices[-1]
        if slices:  # the newest slice is over: its tails are deflated
            over = slices[-1]
            over.tails = zlib.compress(over.tails, 1) if over.tails else b""
        slices.append(_Slice(now))
        return slices[-1]
