"""Where the broker's two scripts spend Redis's time, section by section (issue 19): the same
8-bucket request as bench/redis_script_cost.py (fair-queue fast path + reconcile), run through
a copy of the function library whose queue_admit and settle bodies carry redis.call('TIME')
marks between their sections; prints the mean µs of each section per call. Wall time inside
the server (a mark costs ~0.5 µs; on a loaded machine compare runs side by side, not with
another day's). Sections are found by the lines that start them, so they follow edits.

    .venv/bin/python bench/redis_script_sections.py [--requests 2000]
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

# (entry script, the start of the line that opens a section, the section's name)
SECTIONS = {
    "queue_admit": [
        ("local specs = specs_load", "admit 1: spec set, clock, epoch"),
        ("local rec = record_load", "admit 2: lease record (replay?)"),
        ("local Q = q_load", "admit 3: queue state"),
        ("local parts = {}", "admit 4: entry and parts"),
        ("local ctx = ", "admit 5: context"),
        ("  local res = reserve_parts", "admit 6: reserve_parts (views, takes)"),
        ("  if res.ok then", "admit 7: -"),
        ("    q_account(Q, e", "admit 8: q_account"),
        ("    return {'V', q_lease(", "admit 9: lease record, reply"),
    ],
    "settle": [
        ("local specs = specs_load", "settle 1: spec set, clock, epoch"),
        ("local rec = record_load", "settle 2: lease record"),
        ("local by_name", "settle 3: parts by name"),
        ("local out = {release", "settle 4: views, settles, reply rows"),
        ("record_mark(rkey, rec, release", "settle 5: lease record marked, lease index"),
    ],
}
PROBE = """
local PROF_T, PROF_N, PROF_LAST, PROF_NAME = {}, {}, 0, nil
local function MARK(name)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if PROF_NAME then
    PROF_T[PROF_NAME] = (PROF_T[PROF_NAME] or 0) + now - PROF_LAST
    PROF_N[PROF_NAME] = (PROF_N[PROF_NAME] or 0) + 1
  end
  PROF_NAME, PROF_LAST = name, now
end
"""
DUMP = """redis.register_function('prof_dump', function(KEYS, ARGV)
  local out = {}
  for k, v in pairs(PROF_T) do
    out[#out + 1] = k
    out[#out + 1] = string.format('%.2f', v / PROF_N[k])
  end
  PROF_T, PROF_N = {}, {}
  return out
end)
"""


def marked(read):  # type: ignore[no-untyped-def]
    def read_marked(name: str) -> str:
        text = read(name)
        if name == "lib":
            return text + PROBE
        if name not in SECTIONS:
            return text
        lines, out, first = text.splitlines(), [], True
        for line in lines:
            for start, section in SECTIONS[name]:
                if line.startswith(start):
                    out.append(("PROF_NAME = nil " if first else "") + f"MARK({section!r})")
                    first = False
                    if start.strip().startswith("return"):  # close the section before it
                        expr = line.strip().removeprefix("return ")
                        line = f"local r__ = {expr} MARK('end') do return r__ end"
            if name == "settle" and line.startswith("return out, specs"):
                out.append("MARK('end')")
            out.append(line)
        return "\n".join(out)

    return read_marked


async def run(requests: int) -> dict[str, float]:
    library._read = marked(library._read)  # type: ignore[method-assign]
    code = library.library_code
    library.library_code = lambda: (lambda d, s: (d, s + DUMP))(*code())  # type: ignore[assignment]
    async with private_broker("script-sections") as (url, store, queue):
        admin = redis.Redis.from_url(url)
        for _ in range(50):
            await admit_and_settle(queue, store, BUCKETS)
        admin.fcall("prof_dump", 0)
        for _ in range(requests):
            await admit_and_settle(queue, store, BUCKETS)
        raw = admin.fcall("prof_dump", 0)
        admin.close()
        return {k.decode(): float(v) for k, v in zip(raw[::2], raw[1::2], strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    sections = asyncio.run(run(args.requests))
    for name in sorted(k for k in sections if k != "end"):
        print(f"{name:40s} {sections[name]:7.2f} µs")


if __name__ == "__main__":
    main()
