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

import mmap
import zlib
from collections import deque
from collections.abc import Iterable

SLICES = 16  # slices per retention time: records outlive ``seconds`` by at most 1/16 of it
_SIZE = 4  # bytes of each length prefix
_TAILED = 1 << 31  # set in a record's length prefix: its tail is in the slice's tails
# Each buffer is a private anonymous mapping of this many bytes: only the pages written are
# resident, and they go back to the system the moment the slice is let go. In the heap (a
# bytearray) the buffers, grown and freed every second, left it fragmented: peak RSS per
# worker stayed ~1.5 MiB above main's at 16 connections. A slice that fills ends early.
_CAPACITY = 1 << 20


class _Buffer:
    __slots__ = ("mapped", "size")

    def __init__(self, need: int) -> None:
        self.mapped = mmap.mmap(-1, max(_CAPACITY, need))
        self.size = 0

    def room(self, need: int) -> bool:
        return self.size + need <= len(self.mapped)

    def add(self, data: bytes) -> None:
        end = self.size + len(data)
        self.mapped[self.size : end] = data
        self.size = end

    def view(self) -> bytes:
        return self.mapped[: self.size]


class _Slice:
    __slots__ = ("records", "start", "tails")

    def __init__(self, start: float, need: int) -> None:
        self.start = start
        self.records = _Buffer(need)  # each record: its length, then the record (its head)
        # the tails of the records that have one, in their order: length-prefixed while the
        # slice fills, deflated (bytes) once it is over
        self.tails: _Buffer | bytes = _Buffer(need)

    def seal(self) -> None:
        tails = self.tails
        if isinstance(tails, _Buffer):
            self.tails = zlib.compress(tails.view(), 1) if tails.size else b""
            tails.mapped.close()

    def close(self) -> None:
        """Give the pages back now."""
        if isinstance(self.tails, _Buffer):
            self.tails.mapped.close()
        self.records.mapped.close()


class KeptRecords:
    """Records appended at a time, kept for at least ``seconds`` after it, oldest first."""

    def __init__(self) -> None:
        self._slices: deque[_Slice] = deque()

    def __bool__(self) -> bool:
        return bool(self._slices)

    def keep(self, now: float, seconds: float, records: Iterable[bytes]) -> None:
        """Keep ``records``, appended at ``now``; let go of what is older than ``seconds``."""
        for record in records:
            self._slice(now, seconds, _SIZE + len(record), 0).records.add(
                len(record).to_bytes(_SIZE, "big") + record
            )

    def keep_tailed(
        self, now: float, seconds: float, head: bytes, tail: bytes, others: list[bytes]
    ) -> None:
        """Keep the record ``head + tail``, whose ``tail`` is much like the tails of the records
        kept about the same time (a carried reservation record's settlement), then ``others``."""
        kept = self._slice(now, seconds, _SIZE + len(head), _SIZE + len(tail))
        kept.records.add((_TAILED | len(head)).to_bytes(_SIZE, "big") + head)
        tails = kept.tails
        assert isinstance(tails, _Buffer)  # the newest slice is never sealed
        tails.add(len(tail).to_bytes(_SIZE, "big") + tail)
        self.keep(now, seconds, others)

    def forget(self, now: float, seconds: float) -> None:
        """Let go of every slice whose records are all older than ``seconds``."""
        slices = self._slices
        while slices and slices[0].start + seconds / SLICES <= now - seconds:
            slices.popleft().close()

    def records(self) -> list[bytes]:
        """Every record kept, oldest first, byte for byte as it was appended."""
        out: list[bytes] = []
        for kept in self._slices:
            tails = kept.tails
            if isinstance(tails, _Buffer):
                tails = tails.view()
            elif tails:
                tails = zlib.decompress(tails)
            data, at, tail_at = kept.records.view(), 0, 0
            while at < len(data):
                size = int.from_bytes(data[at : at + _SIZE], "big")
                start = at + _SIZE
                at = start + (size & ~_TAILED)
                record = data[start:at]
                if size & _TAILED:
                    length = int.from_bytes(tails[tail_at : tail_at + _SIZE], "big")
                    tail_at += _SIZE + length
                    record += tails[tail_at - length : tail_at]
                out.append(record)
        return out

    def _slice(self, now: float, seconds: float, need: int, tail_need: int) -> _Slice:
        """The slice to keep a record in (``need`` bytes, and ``tail_need`` in its tails)."""
        self.forget(now, seconds)
        slices = self._slices
        if slices:
            newest = slices[-1]
            tails = newest.tails
            if (
                now < newest.start + seconds / SLICES
                and newest.records.room(need)
                and isinstance(tails, _Buffer)
                and tails.room(tail_need)
            ):
                return newest
            newest.seal()
        slices.append(_Slice(now, max(need, tail_need)))
        return slices[-1]
