"""The wire format between the Redis store and its Lua scripts: bucket blobs and replies."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from quotas.core.model import (
    BucketRefusal,
    BucketSpec,
    Extension,
    Grant,
    GrantPart,
    Outcome,
    Reason,
    Refusal,
)


def msgpack_array(values: Sequence[str | float | int]) -> bytes:
    """A msgpack array of short strings, small ints and doubles (read by Lua's cmsgpack)."""
    out = bytearray([0x90 | len(values)])
    for v in values:
        if isinstance(v, str):
            b = v.encode()
            if len(b) < 32:
                out.append(0xA0 | len(b))
            else:
                out += b"\xda" + struct.pack(">H", len(b))
            out += b
        elif isinstance(v, int) and 0 <= v < 128:
            out.append(v)
        else:
            out += b"\xcb" + struct.pack(">d", float(v))
    return bytes(out)


def msgpack_list(values: Sequence[str | bytes | float | int]) -> bytes:
    """A msgpack array that may also hold byte strings of any length (as msgpack str, which
    Lua's cmsgpack reads as a Lua string: bytes as they are)."""
    out = bytearray()
    n = len(values)
    out += bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n)
    for v in values:
        if isinstance(v, str | bytes):
            b = v.encode() if isinstance(v, str) else v
            if len(b) < 32:
                out.append(0xA0 | len(b))
            else:  # str 16 even when short: the oldest cmsgpack reads no str 8
                out += b"\xda" + struct.pack(">H", len(b))
            out += b
        elif isinstance(v, int) and 0 <= v < 128:
            out.append(v)
        else:
            out += b"\xcb" + struct.pack(">d", float(v))
    return bytes(out)


def s_(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def f_(value: Any) -> float:
    return float(s_(value))


def refusals(reply: Sequence[Any], at: int) -> tuple[tuple[BucketRefusal, ...], int]:
    count = int(reply[at])
    rows = tuple(
        BucketRefusal(
            s_(reply[at + 1 + 3 * i]), Reason(s_(reply[at + 2 + 3 * i])), f_(reply[at + 3 + 3 * i])
        )
        for i in range(count)
    )
    return rows, at + 1 + 3 * count


def parse_reserve(
    reservation_id: str,
    reply: Sequence[Any],
    parts: Sequence[tuple[BucketSpec, float]],
    lease: float,
) -> Grant | Refusal:
    tag = s_(reply[0])
    now = f_(reply[1])
    if tag == "G":  # a new grant: the buckets in the order asked, their amounts as asked
        n = int(reply[2])
        taken = []
        for i, (spec, amount) in enumerate(parts):
            marker, skipped, left = reply[3 + 3 * i : 6 + 3 * i]
            skipped = skipped in (b"1", "1")
            taken.append(GrantPart(spec, 0.0 if skipped else amount, f_(marker), skipped, f_(left)))
        shadow, _ = refusals(reply, 3 + 3 * n)
        return Grant(reservation_id, now, now + lease, tuple(taken), shadow)
    if tag == "R":
        live, at = refusals(reply, 5)
        shadow, _ = refusals(reply, at)
        return Refusal(
            reservation_id, now, s_(reply[2]), Reason(s_(reply[3])), f_(reply[4]), live, shadow
        )
    specs = {spec.name: spec for spec, _ in parts}
    replayed = []
    for i in range(int(reply[5])):
        name, amount, marker, skipped = reply[6 + 4 * i : 10 + 4 * i]
        known = specs.get(s_(name))
        if known is not None:  # a replay names buckets as they were; ones since removed drop out
            replayed.append(GrantPart(known, f_(amount), f_(marker), s_(skipped) == "1"))
    return Grant(
        reservation_id, f_(reply[2]), f_(reply[3]), tuple(replayed), (), True, s_(reply[4])
    )


GRANT_HEAD = struct.Struct("<dB")  # now, n
GRANT_PART = struct.Struct("<dBd")  # marker, skipped, remaining


def parse_packed_grant(
    reservation_id: str,
    data: bytes,
    parts: Sequence[tuple[BucketSpec, float]],
    lease: float,
    sep: bytes,
) -> Grant:
    """The fair queue's packed grant (queue_lib.lua q_grant_packed): b'g', now and n, then per
    part its marker, skipped and remaining as doubles (skipped a byte), then ``sep``, the
    shadow refusals' count and rows as text."""
    now, n = GRANT_HEAD.unpack_from(data, 1)
    at = 1 + GRANT_HEAD.size
    taken = []
    for (spec, amount), (marker, skipped, left) in zip(
        parts, GRANT_PART.iter_unpack(data[at : at + GRANT_PART.size * n]), strict=True
    ):
        taken.append(GrantPart(spec, 0.0 if skipped else amount, marker, skipped == 1, left))
    shadow, _ = refusals(data[at + GRANT_PART.size * n + 1 :].split(sep), 0)
    return Grant(reservation_id, now, now + lease, tuple(taken), shadow)


def parse_extend(grant: Grant, reply: Sequence[Any]) -> Extension:
    """extend.lua's reply: the lease with its amounts after the step, a refusal, or why the
    lease no longer holds."""
    tag = s_(reply[0])
    rid = grant.reservation_id
    now = f_(reply[1])
    if tag == "R":
        live, at = refusals(reply, 5)
        shadow, _ = refusals(reply, at)
        refusal = Refusal(rid, now, s_(reply[2]), Reason(s_(reply[3])), f_(reply[4]), live, shadow)
        return Extension(rid, Outcome.REFUSED, now, refusal=refusal)
    if tag != "X":
        return Extension(rid, Outcome(tag), now)
    rows: dict[str, tuple[float, float, bool, float | None]] = {}
    at = 5
    for _ in range(int(reply[4])):
        name, amount, marker, skipped, left = (s_(v) for v in reply[at : at + 5])
        rows[name] = (float(amount), float(marker), skipped == "1", float(left) if left else None)
        at += 5
    shadow, _ = refusals(reply, at)
    parts = []
    for part in grant.parts:
        row = rows.get(part.bucket.name)
        parts.append(part if row is None else GrantPart(part.bucket, *row))
    extended = Grant(rid, f_(reply[2]), f_(reply[3]), tuple(parts), shadow)
    return Extension(rid, Outcome.EXTENDED, now, grant=extended)
