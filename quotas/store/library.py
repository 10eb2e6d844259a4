"""The reservation store's and fair queue's Lua, loaded into Redis once as a function library
(Redis 7: ``FUNCTION LOAD``, called with ``FCALL``).

As EVAL scripts, every call re-ran lib.lua's and queue_lib.lua's definitions (~80 local
functions) before doing its work; a library defines them once, when it is loaded, and each
entry script becomes the body of one registered function (``function(KEYS, ARGV) ... end``,
so the entry files read as before).

The library's and its functions' names carry a digest of its source (``reserve_<digest>``):
two versions of the gateway running side by side during a deploy each call their own
functions, as EVALSHA did by content. A Redis that lost the library (restarted without
persistence, ``FUNCTION FLUSH``) answers "Function not found"; ``FunctionLibrary.call`` loads
it again (``FUNCTION LOAD REPLACE``: a concurrent load of the same source is harmless) and
retries once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis.asyncio
from redis.exceptions import ResponseError

LUA = Path(__file__).with_name("lua")
# Entry scripts that need lib.lua, those that stand alone, and the fair queue's (queue_lib.lua).
STORE_ENTRIES = (
    "reserve",
    "settle",
    "extend",
    "renew",
    "reap",
    "pause",
    "observe",
    "charge",
    "levels",
    "recovery",
)
PLAIN_ENTRIES = ("bootstrap", "recovery_end")
QUEUE_ENTRIES = ("queue_admit", "queue_pump", "queue_leave", "queue_settle")
ENTRIES = (*STORE_ENTRIES, *PLAIN_ENTRIES, *QUEUE_ENTRIES)
LIBRARY_PREFIX = "switchyard_"


def _read(name: str) -> str:
    return (LUA / f"{name}.lua").read_text()


def _body(name: str) -> str:
    # settle.lua is a function of its own (settle_main), which queue_settle calls too.
    if name == "settle":
        return "return (settle_main(KEYS, ARGV))"
    return _read(name)


def library_code() -> tuple[str, str]:
    """(digest, source) of the library: lib.lua, queue_lib.lua, settle_main, then one
    registered function per entry script, named ``<entry>_<digest>`` (the digest is of
    everything else, so it is computed first and the names put in after)."""
    parts = [
        _read("lib"),
        _read("queue_lib"),
        f"local function settle_main(KEYS, ARGV)\n{_read('settle')}\nend",
    ]
    parts += (f"redis.register_function('{name}_@', function(KEYS, ARGV)\n{_body(name)}\nend)"
              for name in ENTRIES)  # fmt: skip
    text = "\n".join(parts)
    digest = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
    for name in ENTRIES:
        text = text.replace(
            f"redis.register_function('{name}_@'", f"redis.register_function('{name}_{digest}'"
        )
    return digest, f"#!lua name={LIBRARY_PREFIX}{digest}\n{text}\n"


def _not_found(exc: ResponseError) -> bool:
    return "function not found" in str(exc).lower()


class FunctionLibrary:
    """The library on one Redis: ``call`` runs an entry script by name."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        self.digest, self.source = library_code()
        self.name = f"{LIBRARY_PREFIX}{self.digest}"
        self._names = {entry: f"{entry}_{self.digest}" for entry in ENTRIES}

    def function(self, entry: str) -> str:
        return self._names[entry]

    async def load(self) -> None:
        await self.client.function_load(self.source, replace=True)

    async def ensure(self) -> bool:
        """Load the library unless Redis has it (one FUNCTION LIST); True if it was missing."""
        if await self.client.function_list(library=self.name):
            return False
        await self.load()
        return True

    async def call(self, entry: str, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        name = self._names[entry]
        try:
            return await self.client.fcall(name, len(keys), *keys, *args)  # type: ignore[misc]
        except ResponseError as exc:
            if not _not_found(exc):
                raise
        await self.load()
        return await self.client.fcall(name, len(keys), *keys, *args)  # type: ignore[misc]
