"""The reservation store's and fair queue's Lua, loaded into Redis once as a function library
(Redis 7: ``FUNCTION LOAD``, called with ``FCALL``).

As EVAL scripts, every call re-ran lib.lua's and queue_lib.lua's definitions (~80 local
functions) before doing its work; a library defines them once, when it is loaded, and each
entry script becomes the body of one registered function (``function(KEYS, ARGV) ... end``,
so the entry files read as before).

Calls that come while the process's previous call is on its way go together, in one
``FCALL`` of ``batch`` (lua/batch.lua), which runs them in order, each as if alone: at 16
connections and more the round trips, the command parsing and the socket work of Redis and of
the gateway are paid per batch instead of per call (issue 19). A call with none on its way goes
at once, alone.

The library's and its functions' names carry a digest of its source (``reserve_<digest>``):
two versions of the gateway running side by side during a deploy each call their own
functions, as EVALSHA did by content. A Redis that lost the library (restarted without
persistence, ``FUNCTION FLUSH``) answers "Function not found"; ``FunctionLibrary.call`` loads
it again (``FUNCTION LOAD REPLACE``: a concurrent load of the same source is harmless) and
retries once.
"""

from __future__ import annotations

import asyncio
import functools
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
ENTRIES = (*STORE_ENTRIES, *PLAIN_ENTRIES, *QUEUE_ENTRIES, "batch")
LIBRARY_PREFIX = "switchyard_"
# Calls in one batch at most: a batch holds Redis for its whole run (~0.1 ms a call).
BATCH_MAX = 32


def _read(name: str) -> str:
    return (LUA / f"{name}.lua").read_text()


def _body(name: str) -> str:
    # settle.lua is a function of its own (settle_main), which queue_settle calls too.
    if name == "settle":
        return "return (settle_main(KEYS, ARGV))"
    return _read(name)


def library_code() -> tuple[str, str]:
    """(digest, source) of the library: lib.lua, queue_lib.lua, settle_main, the entry
    scripts as functions in ``ENTRY`` (by name, for batch.lua), then one registered function
    per entry, named ``<entry>_<digest>`` (the digest is of everything else, so it is computed
    first and the names put in after)."""
    parts = [
        _read("lib"),
        _read("queue_lib"),
        f"local function settle_main(KEYS, ARGV)\n{_read('settle')}\nend",
        "local ENTRY = {}",
    ]
    parts += (f"ENTRY['{name}'] = function(KEYS, ARGV)\n{_body(name)}\nend"
              for name in ENTRIES)  # fmt: skip
    parts += (f"redis.register_function('{name}_@', ENTRY['{name}'])" for name in ENTRIES)
    text = "\n".join(parts)
    digest = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
    for name in ENTRIES:
        text = text.replace(
            f"redis.register_function('{name}_@'", f"redis.register_function('{name}_{digest}'"
        )
    return digest, f"#!lua name={LIBRARY_PREFIX}{digest}\n{text}\n"


def _not_found(exc: ResponseError) -> bool:
    return "function not found" in str(exc).lower()


Call = tuple[str, Sequence[str], Sequence[str | bytes], "asyncio.Future[Any]"]


class FunctionLibrary:
    """The library on one Redis: ``call`` runs an entry script by name."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        self.digest, self.source = library_code()
        self.name = f"{LIBRARY_PREFIX}{self.digest}"
        self._names = {entry: f"{entry}_{self.digest}" for entry in ENTRIES}
        # The calls waiting for the one on its way (of this event loop: tests run several).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy = False
        self._waiting: list[Call] = []
        self._sending: set[asyncio.Task[None]] = set()

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
        """Run ``entry``: at once if no call of this process is on its way, else in the next
        batch (its reply, or its error, is this call's own)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._busy, self._waiting = loop, False, []
        if self._busy:
            future: asyncio.Future[Any] = loop.create_future()
            self._waiting.append((entry, keys, args, future))
            return await future
        self._busy = True
        try:
            return await self._fcall(entry, keys, args)
        finally:
            self._next()

    async def _fcall(self, entry: str, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        name = self._names[entry]
        try:
            return await self.client.fcall(name, len(keys), *keys, *args)  # type: ignore[misc]
        except ResponseError as exc:
            if not _not_found(exc):
                raise
        await self.load()
        return await self.client.fcall(name, len(keys), *keys, *args)  # type: ignore[misc]

    def _next(self) -> None:
        """The call on its way is done: send what waited (one batch), or be idle."""
        if not self._waiting:
            self._busy = False
            return
        batch, self._waiting = self._waiting[:BATCH_MAX], self._waiting[BATCH_MAX:]
        task = asyncio.ensure_future(self._send(batch))
        self._sending.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(functools.partial(self._sent, batch))

    def _sent(self, batch: list[Call], task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        if task.cancelled():  # the loop is closing: the batch's callers go, and those waiting
            for *_, future in (*batch, *self._waiting):
                future.cancel()
            self._waiting, self._busy = [], False

    async def _send(self, batch: list[Call]) -> None:
        # A caller that was cancelled while it waited is not sent (it did not happen).
        batch = [call for call in batch if not call[3].done()]
        outcomes: list[Any] = []
        try:
            if len(batch) == 1:
                entry, keys, args, _ = batch[0]
                outcomes = [await self._fcall(entry, keys, args)]
            elif batch:
                outcomes = await self._batch(batch)
        except Exception as exc:  # the call failed, or the whole batch (the connection broke)
            outcomes = [exc] * len(batch)
        self._next()
        for (*_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def _batch(self, batch: list[Call]) -> list[Any]:
        keys: list[str] = []
        head: list[str | bytes] = [str(len(batch))]
        args: list[str | bytes] = []
        for entry, call_keys, call_args, _ in batch:
            head += (entry, str(len(call_keys)), str(len(call_args)))
            keys += call_keys
            args += call_args
        replies = await self._fcall("batch", keys, [*head, *args])
        # {reply}, {} for a nil reply, or the call's error (redis-py returns it, not raises)
        return [r if isinstance(r, ResponseError) else (r[0] if r else None) for r in replies]
