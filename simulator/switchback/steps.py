"""A stream's output reserved in steps on the simulated clock (SPEC C10's second approach), as
``gateway.steps.StreamSteps`` does it on the real path, driving the same core code: the step
plan (``quotas.core.increments.StepPlan``) and the store's ``extend`` (here the in-memory
``Book.extend``, the twin of ``extend.lua``).

At admission the stream reserves ``plan.first_step(max)`` of output (``admission``). The relay
reports each token as it arrives; the provider model's answer says when they arrive (the first
at ``ttft_s``, then one every ``1 / tokens_per_s``), so the token at which ``plan.top_up``
first asks for more is known in advance and its step is scheduled then. One step is in flight
at a time; the simulated network is instantaneous, so a step lands at the token that asked for
it. A refused step stops the asking, not the answer: the stream goes on and settles its real
usage (what it made beyond its reservation is charged then). A step due after the stream ended
(a failure cut it) is never asked.
"""

from __future__ import annotations

from quotas.core.increments import StepPlan
from quotas.core.model import Grant, Outcome, Usage
from quotas.store.memory import MemoryReservationStore
from simulator.model import Plan
from simulator.switchback.loop import EventLoop


class SimSteps:
    """One stream's reservation in steps: what its lease holds and when it asks for more."""

    __slots__ = (
        "answer",
        "grant",
        "granted",
        "held_since",
        "loop",
        "max_output",
        "over",
        "plan",
        "price_output",
        "refused",
        "refused_by",
        "reserved",
        "reserved_s",
        "started",
        "store",
    )

    def __init__(
        self,
        plan: StepPlan,
        *,
        grant: Grant,
        max_output: int,
        price_output: float,
        store: MemoryReservationStore,
        loop: EventLoop,
    ) -> None:
        self.plan, self.grant, self.max_output = plan, grant, max_output
        self.price_output = price_output  # USD per million output tokens
        self.store, self.loop = store, loop
        self.reserved = plan.first_step(max_output)  # what admission reserved
        self.granted = 0  # steps granted after the first
        self.refused = False  # a step was refused (or the lease is gone): none is asked again
        self.refused_by = ""  # the bucket that refused it
        self.over = False  # the stream ended: no step is asked any more
        self.answer: Plan | None = None
        self.started = 0.0
        self.reserved_s = 0.0  # ∫ reserved dt up to held_since (token-seconds)
        self.held_since = 0.0

    def start(self, answer: Plan, started: float) -> None:
        """The provider admitted the stream at ``started``: schedule its first top-up."""
        self.answer, self.started, self.held_since = answer, started, started
        self._schedule(0)

    def end(self) -> Grant:
        """The stream is over (answered, failed): no further step. The lease to settle."""
        self.over = True
        self._hold()
        return self.grant

    def _hold(self) -> None:
        now = self.loop.now
        self.reserved_s += self.reserved * (now - self.held_since)
        self.held_since = now

    def _schedule(self, generated: int) -> None:
        """The next step is asked at the first token ``g`` > ``generated`` for which
        ``plan.top_up(reserved, g, max)`` is positive: ``g = reserved - headroom + 1``."""
        answer = self.answer
        assert answer is not None
        if self.reserved >= self.max_output:
            return
        due = max(generated + 1, self.reserved - self.plan.headroom + 1, 1)
        if due > answer.tokens_to_send:
            return  # the answer ends first
        at = self.started + answer.ttft_s + (due - 1) / answer.tokens_per_s
        self.loop.schedule(at, self._step, due)

    def _step(self, generated: int) -> None:
        if self.over or self.refused:
            return
        more = self.plan.top_up(self.reserved, generated, self.max_output)
        if more <= 0:
            return
        step = Usage(
            requests=0.0,
            output_tokens=float(more),
            spend=more * self.price_output / 1e6,
            concurrency=0.0,
        )
        result = self.store.extend(self.grant, step, now=self.loop.now)
        if result.outcome is Outcome.EXTENDED and result.grant is not None:
            self._hold()
            self.reserved += more
            self.granted += 1
            self.grant = result.grant
            self._schedule(generated)
        else:
            self.refused = True
            refusal = result.refusal
            self.refused_by = refusal.bucket if refusal is not None else result.outcome.value
