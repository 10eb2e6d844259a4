"""A provider's batch API (SPEC E5), the part both wires share: batches and their lines.

A batch's lines are answered by the same behaviour model as live calls (``plan_batch``: outside
the rate limits, as a provider's separate batch queue is), spread evenly over the market's
``turnaround`` (times the latency scale) from the batch's creation: line ``i`` of ``n`` is due
``(i + 1) / n`` of the way. Lines are answered when they are due and somebody looks (a GET,
``/_stats``) or the batch's end timer fires, so a poll sees the counts grow. A cancelled batch
ends at once; its lines not yet due are never run. The wire shapes are in
``openai_batches.py`` and ``anthropic_batches.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from simulator.model import ProviderBehaviour, Rejection
from simulator.model.market import BatchSpec
from simulator.server.anthropic_wire import AnthropicWire
from simulator.server.common import BadRequest, make_content, make_id
from simulator.server.openai_wire import OpenAIWire

# Anthropic's parser insists on its version header; a batch line carries none of its own.
_LINE_HEADERS = {"anthropic-version": "2023-06-01"}


@dataclass
class BatchLine:
    custom_id: str
    body: bytes  # the request as a live call's body would be
    due: float  # epoch seconds at which it is answered
    status: int = 0  # 0 until answered; then the HTTP status a live call would have had
    answer: dict[str, Any] | None = None  # the live call's JSON answer (or error envelope)
    request_id: str = ""


@dataclass
class ProviderBatch:
    id: str
    created_at: float
    ends_at: float
    lines: list[BatchLine]
    extra: dict[str, Any] = field(default_factory=dict)  # the wire's own fields (endpoint, …)
    answered: int = 0  # lines[:answered] have their answer
    cancel_requested_at: float | None = None
    ended_at: float | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancel_requested_at is not None

    def count(self, status_ok: bool) -> int:
        return sum(1 for line in self.lines[: self.answered] if (line.status < 400) == status_ok)


class BatchBook:
    """One provider's batches, and the lines each still has to answer."""

    def __init__(
        self,
        behaviour: ProviderBehaviour,
        wire: OpenAIWire | AnthropicWire,
        spec: BatchSpec,
        rng: random.Random,
        *,
        latency_scale: float,
        clock: Callable[[], float],
    ) -> None:
        self.behaviour = behaviour
        self.wire = wire
        self.spec = spec
        self.rng = rng
        self.latency_scale = latency_scale
        self.clock = clock
        self.batches: dict[str, ProviderBatch] = {}
        self._keyed: dict[str, str] = {}  # Idempotency-Key → the batch it created

    def create(
        self, prefix: str, lines: list[tuple[str, bytes]], key: str | None, **extra: Any
    ) -> ProviderBatch:
        """A new batch of ``(custom_id, request body)`` lines; a key seen before is answered
        with the batch it created, as a provider that keeps keys does (a client that died
        after sending the create cannot make a second batch of the same lines)."""
        if key and key in self._keyed:
            return self.batches[self._keyed[key]]
        now = self.clock()
        span = self.spec.turnaround * self.latency_scale
        n = len(lines)
        batch = ProviderBatch(
            id=make_id(self.rng, prefix, 24),
            created_at=now,
            ends_at=now + span,
            lines=[
                BatchLine(cid, body, now + span * (i + 1) / n)
                for i, (cid, body) in enumerate(lines)
            ],
            extra=extra,
        )
        self.batches[batch.id] = batch
        if key:
            self._keyed[key] = batch.id
        self.behaviour.counters.batch.batches += 1
        with contextlib.suppress(RuntimeError):  # no loop (a unit test): answered when looked at
            asyncio.get_running_loop().call_later(span, self.advance, batch)
        return batch

    def get(self, batch_id: str) -> ProviderBatch | None:
        batch = self.batches.get(batch_id)
        if batch is not None:
            self.advance(batch)
        return batch

    def advance(self, batch: ProviderBatch) -> None:
        """Answer the lines that are due; end the batch once all are (or it was cancelled)."""
        if batch.ended_at is not None:
            return
        now = self.clock()
        while batch.answered < len(batch.lines) and batch.lines[batch.answered].due <= now:
            self._answer(batch.lines[batch.answered], now)
            batch.answered += 1
        if batch.answered == len(batch.lines) or batch.cancelled:
            batch.ended_at = now
            unrun = len(batch.lines) - batch.answered
            self.behaviour.counters.batch.lines_cancelled += unrun

    def cancel(self, batch: ProviderBatch) -> None:
        """Stop the batch: lines already due are answered, the rest never run."""
        self.advance(batch)
        if batch.ended_at is None:
            batch.cancel_requested_at = self.clock()
            self.behaviour.counters.batch.cancelled += 1
            self.advance(batch)

    def stats(self) -> None:
        """Bring every open batch up to date (``/_stats`` counts what is due as done)."""
        for batch in self.batches.values():
            self.advance(batch)

    def reset(self) -> None:
        """Forget every batch (as a provider that lost them: 404s), their end timers included."""
        now = self.clock()
        for batch in self.batches.values():
            batch.ended_at = batch.ended_at or now
        self.batches.clear()
        self._keyed.clear()

    def _answer(self, line: BatchLine, now: float) -> None:
        """The line answered as the same request sent live would have been."""
        wire, counters = self.wire, self.behaviour.counters.batch
        counters.custom_ids[line.custom_id] += 1
        try:
            parsed = wire.parse(_LINE_HEADERS, line.body)
        except BadRequest as error:
            self._set(line, wire.bad_request(error).status, wire.bad_request(error).body)
            return
        outcome = self.behaviour.plan_batch(now, parsed.request)
        if isinstance(outcome, Rejection):
            refused = wire.rejection(outcome, parsed.request.model, now)
            self._set(line, refused.status, refused.body)
        elif outcome.failure is not None:
            failed = wire.failure(outcome.failure.status, [])
            self._set(line, failed.status, failed.body)
        else:
            content = make_content(outcome, self.rng, wire.tool_id_prefix)
            self._set(line, 200, wire.completion(outcome, content, now))

    def _set(self, line: BatchLine, status: int, body: bytes) -> None:
        counters = self.behaviour.counters.batch
        line.status, line.answer = status, orjson.loads(body)
        line.request_id = make_id(self.rng, "req_", 32)
        counters.lines += 1
        if status < 400:
            counters.succeeded += 1
        else:
            counters.errored += 1
