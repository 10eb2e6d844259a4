"""What each bucket rule costs inside the broker's two scripts (issue 19): the same 8-bucket
request as bench/redis_script_cost.py (fair-queue fast path + reconcile), run through a copy of
the function library whose reserve_parts and settle.lua time each bucket's view and take /
settle with redis.call('TIME') (a pair of marks costs ~0.5-1 µs: the "empty" row); prints the
mean µs per call and the number of calls, per rule and step. Lines are found by their text, so
an edit to them fails loudly here rather than timing the wrong thing.

    .venv/bin/python bench/redis_rule_cost.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

import quotas.store.library as library
from bench.redis_script_cost import BUCKETS, admit_and_settle, private_broker

HEAD = """
local PT, PN = {}, {}
local function TT()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function ACC(name, t0)
  PT[name] = (PT[name] or 0) + TT() - t0
  PN[name] = (PN[name] or 0) + 1
end
"""
# (file, line as it is, the line with marks around its call)
MARKS = {
    "lib": [
        (
            "      v = view(p, p.key, p.hkey, now, ctx.born, ctx.limit)",
            "      local t0 = TT() v = view(p, p.key, p.hkey, now, ctx.born, ctx.limit)"
            " ACC(p.rule .. ' admit view', t0) ACC('empty', TT())",
        ),
        (
            "      local marker = take(p, views[i], p.key, p.hkey, now, p.amount, ctx.id,"
            " ctx.expiry)",
            "      local t0 = TT() local marker = take(p, views[i], p.key, p.hkey, now, p.amount,"
            " ctx.id, ctx.expiry) ACC(p.rule .. ' admit take', t0)",
        ),
    ],
    "settle": [
        (
            "        local v = view(p, p.key, p.hkey, now, born, limit, settle_field(p, marker,"
            " id))",
            "        local t0 = TT() local v = view(p, p.key, p.hkey, now, born, limit,"
            " settle_field(p, marker, id)) ACC(p.rule .. ' settle view', t0)",
        ),
        (
            "        settle(p, v, p.key, p.hkey, now, seg, held, marker, id)",
            "        local t1 = TT() settle(p, v, p.key, p.hkey, now, seg, held, marker, id)"
            " ACC(p.rule .. ' settle write', t1)",
        ),
    ],
}
DUMP = """redis.register_function('rule_dump', function(KEYS, ARGV)
  local out = {}
  for k, v in pairs(PT) do
    out[#out + 1] = k
    out[#out + 1] = string.format('%.2f %d', v / PN[k], PN[k])
  end
  PT, PN = {}, {}
  return out
end)
"""


def marked(read):  # type: ignore[no-untyped-def]
    def read_marked(name: str) -> str:
        text = read(name)
        for line, with_marks in MARKS.get(name, []):
            if line not in text:
                raise SystemExit(f"{name}.lua no longer has the line: {line.strip()}")
            text = text.replace(line, with_marks)
        return HEAD + text if name == "lib" else text

    return read_marked


async def run(requests: int) -> dict[str, str]:
    library._read = marked(library._read)  # type: ignore[method-assign]
    code = library.library_code
    library.library_code = lambda: (lambda d, s: (d, s + DUMP))(*code())  # type: ignore[assignment]
    async with private_broker("rule-cost") as (url, store, queue):
        admin = redis.Redis.from_url(url)
        for _ in range(50):
            await admit_and_settle(queue, store, BUCKETS)
        admin.fcall("rule_dump", 0)
        for _ in range(requests):
            await admit_and_settle(queue, store, BUCKETS)
        raw = admin.fcall("rule_dump", 0)
        admin.close()
        return {k.decode(): v.decode() for k, v in zip(raw[::2], raw[1::2], strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    for name, value in sorted(asyncio.run(run(args.requests)).items()):
        mean, calls = value.split()
        print(f"{name:32s} {float(mean):7.2f} µs  {calls:>6s} calls")


if __name__ == "__main__":
    main()
