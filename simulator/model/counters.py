"""What a provider has served, for ``GET /_stats`` and for the switchback experiment's checks."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# A client that hung up before the end is counted under this status (nginx's convention).
CLIENT_CLOSED = 499


@dataclass
class ModelCounters:
    requests: int = 0
    responses: Counter[int] = field(default_factory=Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "responses": {str(status): n for status, n in sorted(self.responses.items())},
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
        }


@dataclass
class KeyCounters:
    """What one API key of the organisation sent (B2): a test checks each key's limit."""

    requests: int = 0  # calls that reached the limits (authenticated, known model)
    admitted: int = 0
    input_tokens: int = 0
    rate_limited: int = 0
    unauthorized: int = 0  # 401s: revoked or unknown key

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class BatchCounters:
    """What the batch API served (E5): lines answered there are not live ``requests``. Each
    line's ``custom_id`` is counted, so a test can tell that none was answered twice."""

    batches: int = 0
    cancelled: int = 0
    lines: int = 0  # answered (succeeded or errored), not cancelled
    succeeded: int = 0
    errored: int = 0
    lines_cancelled: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    custom_ids: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "cancelled": self.cancelled,
            "lines": self.lines,
            "succeeded": self.succeeded,
            "errored": self.errored,
            "lines_cancelled": self.lines_cancelled,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "custom_ids": len(self.custom_ids),
            "custom_ids_repeated": sum(1 for n in self.custom_ids.values() if n > 1),
        }


@dataclass
class ProviderCounters:
    """Totals since start or the last reset; ``rate_limited`` counts 429s by reason."""

    requests: int = 0
    responses: Counter[int] = field(default_factory=Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    peak_concurrency: int = 0
    rate_limited: Counter[str] = field(default_factory=Counter)
    tool_calls: int = 0
    malformed_tool_calls: int = 0
    disconnects: int = 0
    models: dict[str, ModelCounters] = field(default_factory=dict)
    keys: dict[str, KeyCounters] = field(default_factory=dict)
    batch: BatchCounters = field(default_factory=BatchCounters)

    def key(self, name: str) -> KeyCounters:
        counters = self.keys.get(name)
        if counters is None:
            counters = self.keys[name] = KeyCounters()
        return counters

    def model(self, name: str) -> ModelCounters:
        counters = self.models.get(name)
        if counters is None:
            counters = self.models[name] = ModelCounters()
        return counters

    def record_request(self, model: str | None) -> None:
        self.requests += 1
        if model is not None:
            self.model(model).requests += 1

    def record_response(self, status: int, model: str | None) -> None:
        self.responses[status] += 1
        if model is not None:
            self.model(model).responses[status] += 1

    def record_refused(self, status: int, model: str | None) -> None:
        """A request refused before the behaviour model saw it (bad JSON, no API key, …)."""
        self.record_request(model)
        self.record_response(status, model)

    def as_dict(self, concurrency: int) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "responses": {str(status): n for status, n in sorted(self.responses.items())},
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "concurrency": concurrency,
            "peak_concurrency": self.peak_concurrency,
            "rate_limited": dict(sorted(self.rate_limited.items())),
            "tool_calls": self.tool_calls,
            "malformed_tool_calls": self.malformed_tool_calls,
            "disconnects": self.disconnects,
            "models": {name: counters.as_dict() for name, counters in sorted(self.models.items())},
            "keys": {name: counters.as_dict() for name, counters in sorted(self.keys.items())},
            "batch": self.batch.as_dict(),
        }
