"""Anthropic Messages stream → OpenAI ``chat.completion.chunk`` dicts.

Event flow (Anthropic streaming docs): ``message_start``, then per content block
``content_block_start`` / ``content_block_delta``… / ``content_block_stop``, one or more
``message_delta`` (stop reason, cumulative usage), ``message_stop``; ``ping`` and ``error``
events may come at any time, and new event types may be added (ignored here).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.providers.base import JSON, Classified, SSEEvent, StreamError, Usage
from gateway.providers.errors import malformed

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def finish_reason_for(stop_reason: Any) -> str:
    return FINISH_REASONS.get(str(stop_reason), "stop") if stop_reason else ""


def string_field(value: Any) -> str:
    """A string field of an event; anything else is a malformed event (caught in ``feed``)."""
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


@dataclass
class UsageParts:
    """Anthropic's usage split; its ``input_tokens`` excludes cache reads and writes."""

    input_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output_tokens: int = 0

    def update(self, raw: Any) -> bool:
        """Take the fields present in ``raw`` (message_delta counts are cumulative)."""
        if not isinstance(raw, dict):
            return False
        if "input_tokens" in raw and raw["input_tokens"] is not None:
            self.input_tokens = _count(raw["input_tokens"])
        if raw.get("cache_read_input_tokens") is not None:
            self.cache_read = _count(raw["cache_read_input_tokens"])
        if raw.get("cache_creation_input_tokens") is not None:
            self.cache_write = _count(raw["cache_creation_input_tokens"])
        if raw.get("output_tokens") is not None:
            self.output_tokens = _count(raw["output_tokens"])
        return True

    def canonical(self) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + self.cache_read + self.cache_write,
            cached_input_tokens=self.cache_read,
            output_tokens=self.output_tokens,
        )


def usage_from_anthropic(raw: Any) -> Usage | None:
    parts = UsageParts()
    return parts.canonical() if parts.update(raw) else None


@dataclass
class AnthropicStreamTranslator:
    response_id: str
    model: str
    created: int
    classify_error: Callable[[Any], Classified]  # the adapter's classifier for error objects
    usage: Usage | None = None
    finish_reason: str = ""
    _done: bool = False
    _parts: UsageParts = field(default_factory=UsageParts)
    _tool_index: dict[int, int] = field(default_factory=dict)  # block index → tool call index
    _finish_sent: bool = False

    @property
    def done(self) -> bool:
        return self._done

    def _chunk(self, delta: JSON, finish_reason: str | None = None) -> JSON:
        return {
            "id": self.response_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    def _take_usage(self, raw: Any) -> None:
        if self._parts.update(raw):
            self.usage = self._parts.canonical()

    def feed(self, event: SSEEvent) -> list[JSON]:
        try:
            data = orjson.loads(event.data)
        except ValueError:
            raise StreamError(malformed("stream event")) from None
        if not isinstance(data, dict):
            raise StreamError(malformed("stream event"))
        kind = data.get("type") or event.event
        try:
            return self._handle(kind, data)
        except (KeyError, TypeError, AttributeError):
            raise StreamError(malformed(f"{kind} event")) from None

    def _handle(self, kind: Any, data: JSON) -> list[JSON]:
        if kind == "error":
            raise StreamError(self.classify_error(data.get("error")))
        if kind == "message_start":
            self._take_usage(data["message"].get("usage"))
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            return self._block_start(data["index"], data["content_block"])
        if kind == "content_block_delta":
            return self._block_delta(data["index"], data["delta"])
        if kind == "message_delta":
            self._take_usage(data.get("usage"))
            stop_reason = (data.get("delta") or {}).get("stop_reason")
            if not stop_reason or self._finish_sent:
                return []
            self.finish_reason = finish_reason_for(stop_reason)
            self._finish_sent = True
            return [self._chunk({}, self.finish_reason)]
        if kind == "message_stop":
            self._done = True
            if self.usage is None:
                return []
            # OpenAI's include_usage chunk: no choices, usage only.
            usage_chunk = {**self._chunk({}), "choices": [], "usage": self.usage.as_openai()}
            return [usage_chunk]
        return []  # ping, content_block_stop, and event types added later

    def _block_start(self, index: int, block: JSON) -> list[JSON]:
        if block.get("type") == "text" and block.get("text"):
            return [self._chunk({"content": string_field(block["text"])})]
        if block.get("type") != "tool_use":
            return []  # thinking and server-tool blocks have no chat-completion form
        call_id, name = string_field(block["id"]), string_field(block["name"])
        initial = block.get("input")  # {} when streaming; the arguments follow as deltas
        arguments = json.dumps(initial, separators=(",", ":")) if initial else ""
        tool_index = len(self._tool_index)
        self._tool_index[index] = tool_index
        call = {
            "index": tool_index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        return [self._chunk({"tool_calls": [call]})]

    def _block_delta(self, index: int, delta: JSON) -> list[JSON]:
        kind = delta.get("type")
        if kind == "text_delta":
            text = string_field(delta["text"])
            return [self._chunk({"content": text})] if text else []
        if kind == "input_json_delta" and index in self._tool_index:
            partial = string_field(delta.get("partial_json") or "")
            if not partial:
                return []
            call = {"index": self._tool_index[index], "function": {"arguments": partial}}
            return [self._chunk({"tool_calls": [call]})]
        return []  # thinking_delta, signature_delta, citations_delta
