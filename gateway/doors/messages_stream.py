"""A relayed stream as Anthropic's server-sent events.

Anthropic's sequence: ``message_start``, a ``ping``, per content block
``content_block_start`` / ``content_block_delta``… / ``content_block_stop``, then
``message_delta`` (stop reason, cumulative usage) and ``message_stop``; an ``error`` event if
the stream breaks. From an OpenAI-protocol provider it is built from the chat chunks; from an
Anthropic-protocol provider the events go out as they came (thinking and signature deltas,
citations, cache usage intact), only ``message_start`` carrying Switchyard's id and the model
as the client named it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from common.errors import GatewayError
from gateway.doors.messages_answer import anthropic_usage, stop_reason_for
from gateway.providers.base import SSEEvent, Usage

JSON = dict[str, Any]


def sse(name: str, data: JSON) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def error_event(error_type: str, message: str) -> bytes:
    return sse("error", {"type": "error", "error": {"type": error_type, "message": message}})


@dataclass
class MessagesStreamRenderer:
    message_id: str
    model: str
    input_tokens: int  # the estimate, until the provider's usage comes (at the end, for OpenAI)
    passthrough: bool = False
    # GatewayError → Anthropic error type (the door's mapping)
    error_type_for: Callable[[GatewayError], str] = lambda error: "api_error"
    _started: bool = False
    _index: int = -1  # the open content block's index
    _open: str = ""  # its type: "text", "tool_use" or "" (none open)
    _tools: dict[int, int] = field(default_factory=dict)  # tool call index → block index
    _finish: str = ""

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        message: JSON = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return sse("message_start", {"type": "message_start", "message": message}) + sse(
            "ping", {"type": "ping"}
        )

    def _close_block(self) -> bytes:
        if not self._open:
            return b""
        self._open = ""
        return sse("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _open_block(self, kind: str, block: JSON) -> bytes:
        out = self._close_block()
        self._index += 1
        self._open = kind
        return out + sse(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def _delta(self, index: int, delta: JSON) -> bytes:
        return sse(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )

    def feed(self, event: SSEEvent, chunks: list[JSON]) -> bytes:
        if self.passthrough:
            return self._pass(event)
        out = [self._start()]
        for chunk in chunks:
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                text = delta.get("content")
                if text:
                    if self._open != "text":
                        out.append(self._open_block("text", {"type": "text", "text": ""}))
                    out.append(self._delta(self._index, {"type": "text_delta", "text": text}))
                for call in delta.get("tool_calls") or ():
                    out.append(self._tool_call(call))
                if choice.get("finish_reason"):
                    self._finish = str(choice["finish_reason"])
        return b"".join(out)

    def _tool_call(self, call: JSON) -> bytes:
        position = call.get("index", 0)
        function = call.get("function") or {}
        out = b""
        if position not in self._tools:
            block = {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": {},
            }
            out = self._open_block("tool_use", block)
            self._tools[position] = self._index
        arguments = function.get("arguments")
        # A later part of an earlier call, after another block opened, has no place in
        # Anthropic's order; providers stream one call after the other, so it does not come.
        if arguments and self._tools[position] == self._index:
            out += self._delta(self._index, {"type": "input_json_delta", "partial_json": arguments})
        return out

    def _pass(self, event: SSEEvent) -> bytes:
        name = event.event
        if name == "message":  # an unnamed event: its data says what it is
            name = str(orjson.loads(event.data).get("type") or "")
        if name == "message_start":
            data = orjson.loads(event.data)
            data["message"] = {**data["message"], "id": self.message_id, "model": self.model}
            self._started = True
            return sse("message_start", data)
        if name == "error":
            return b""  # the relay reports the failure through ``fail``, in our words
        return b"event: " + name.encode() + b"\ndata: " + event.data.encode() + b"\n\n"

    async def close(self, usage: Usage | None, finish_reason: str) -> bytes:
        if self.passthrough:
            return b""  # the provider's message_delta and message_stop went out as they came
        out = [self._start(), self._close_block()]
        usage_data = anthropic_usage(usage or Usage(input_tokens=self.input_tokens))
        delta = {
            "stop_reason": stop_reason_for(finish_reason or self._finish),
            "stop_sequence": None,
        }
        out.append(
            sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage_data})
        )
        out.append(sse("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def fail(self, error: GatewayError) -> bytes:
        return error_event(self.error_type_for(error), error.message)
