"""Streaming reservations in steps (SPEC C10's second approach), opt-in per workload class.

By default a stream reserves its whole maximum output (``max_tokens``) for as long as it runs and
gives back the unused part at the end. Most answers use a fraction of it, so on a market where
tokens are the scarce resource the reserve-max rule keeps capacity idle that others could be
served with. In steps, a stream reserves ``step_tokens`` of output at admission and one more
step each time fewer than ``headroom_tokens`` of what it holds are left unused, never past the
maximum:

    reserved_0 = min(max_output, step)
    top-up     = min(max(step, generated - reserved + headroom), max_output - reserved)
                 when reserved - generated < headroom

The trade: a step can be refused after the provider has already accepted the call. The answer
is then not cut (the provider charges for what it makes either way, and a cut answer is worth
nothing to the caller); the stream goes on and settles its real usage, so a bucket can be
over-used by at most ``max_output - reserved`` per stream in flight, and no further step is
asked for that stream. Whether the mode pays is measured on the saturated market
(``bench/results/``), not assumed.

Pure: no clock, no store; the gateway and the switchback simulator drive it.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_STEP_TOKENS = 256


@dataclass(frozen=True, slots=True)
class StepPlan:
    """How a stream's output reservation grows: ``step_tokens`` at a time, topped up when
    fewer than ``headroom_tokens`` reserved tokens are left (default: half a step, so a top-up
    round trip has half a step of generation to land in)."""

    step_tokens: int = DEFAULT_STEP_TOKENS
    headroom_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.step_tokens < 1:
            raise ValueError("step_tokens must be at least 1")
        if self.headroom_tokens is not None and not 0 <= self.headroom_tokens <= self.step_tokens:
            raise ValueError("headroom_tokens must be between 0 and step_tokens")

    @property
    def headroom(self) -> int:
        return self.step_tokens // 2 if self.headroom_tokens is None else self.headroom_tokens

    def first_step(self, max_output: int) -> int:
        """Output tokens to reserve at admission."""
        return max(0, min(max_output, self.step_tokens))

    def top_up(self, reserved: int, generated: int, max_output: int) -> int:
        """Output tokens to add now that ``generated`` of ``reserved`` are made (0: none yet,
        or the maximum is reserved already). One step, or — when the stream has outrun its
        reservation (a top-up landed late) — what it made beyond it plus the headroom, so the
        buckets count what the provider has already produced."""
        if reserved >= max_output or reserved - generated >= self.headroom:
            return 0
        return min(
            max(self.step_tokens, generated - reserved + self.headroom), max_output - reserved
        )
