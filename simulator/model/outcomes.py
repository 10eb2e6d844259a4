"""What ``ProviderBehaviour.admit`` decides: a :class:`Plan` to serve, or a :class:`Rejection`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from simulator.model.limits import LimitStatus, RejectionReason

# Protocol-neutral stop reasons; the wire maps them (OpenAI: stop/length/tool_calls/stop;
# Anthropic: end_turn/max_tokens/tool_use/stop_sequence).
StopReason = Literal["end", "max_tokens", "tool_use", "stop_sequence"]
FailureKind = Literal["error", "overload"]


@dataclass(frozen=True)
class ToolCall:
    """The tool call a plan produces. ``arguments_json`` is the text the model "wrote": for OpenAI
    invalid JSON when ``malformed``; for Anthropic always a JSON object (schema-violating when
    ``malformed``), because that protocol carries the parsed object."""

    name: str
    arguments_json: str
    malformed: bool


@dataclass(frozen=True)
class Failure:
    """The request fails with ``status`` after streaming ``after_tokens`` tokens (0: at once,
    before any output and without waiting for the first token)."""

    status: int  # 500, or 503 (openai) / 529 (anthropic) for overload
    kind: FailureKind
    after_tokens: int


@dataclass(frozen=True)
class Plan:
    """An admitted request: how to serve it. Hand it back to ``finish`` exactly once.

    Timeline: the first token comes ``ttft_s`` after admission, then ``tokens_to_send`` tokens at
    ``tokens_per_s``; ``duration_s`` is the whole (0 for an at-once failure).
    """

    serial: int
    model: str
    admitted_at: float
    input_tokens: int  # all prompt tokens, cached ones included (OpenAI's prompt_tokens)
    cached_input_tokens: int  # cache reads
    cache_creation_input_tokens: int  # cache writes (only when the request asked for caching)
    reserved_output_tokens: int  # debited from the output-token bucket at admission
    ttft_s: float
    tokens_per_s: float
    output_tokens: int  # produced on success
    stop_reason: StopReason
    stop_sequence: str | None
    tool_call: ToolCall | None
    failure: Failure | None
    limits: LimitStatus  # after this request's debit, for the success response's headers

    @property
    def status(self) -> int:
        return 200 if self.failure is None else self.failure.status

    @property
    def tokens_to_send(self) -> int:
        return self.output_tokens if self.failure is None else self.failure.after_tokens

    @property
    def fails_at_once(self) -> bool:
        return self.failure is not None and self.failure.after_tokens == 0

    @property
    def duration_s(self) -> float:
        if self.fails_at_once:
            return 0.0
        return self.ttft_s + self.tokens_to_send / self.tokens_per_s

    def tokens_sent_by(self, elapsed_s: float) -> int:
        """Tokens produced ``elapsed_s`` after admission (the first one at ``ttft_s``)."""
        if self.fails_at_once or elapsed_s < self.ttft_s:
            return 0
        produced = 1 + math.floor((elapsed_s - self.ttft_s) * self.tokens_per_s)
        return min(self.tokens_to_send, produced)


@dataclass(frozen=True)
class Rejection:
    """The request is refused before any work: 429 (limits), 404 (model), 400 (context)."""

    status: int
    reason: RejectionReason
    retryable: bool
    retry_after_s: float | None  # exact; the wire sends ceil() as integer seconds
    limit: int  # the limit that refused (0 when not a limit)
    requested: int  # what this request asked of it
    limits: LimitStatus

    @property
    def retry_after_header(self) -> int | None:
        """``Retry-After`` in whole seconds, never 0 for a retryable refusal."""
        if self.retry_after_s is None:
            return None
        return max(1, math.ceil(self.retry_after_s))
