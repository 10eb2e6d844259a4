"""A relayed stream as the Responses event sequence, translated from OpenAI chat chunks.

    response.created → response.in_progress
    per output item:  response.output_item.added
      a message:        response.content_part.added → response.output_text.delta …
                        → response.output_text.done → response.content_part.done
      a function call:  response.function_call_arguments.delta …
                        → response.function_call_arguments.done
                      response.output_item.done
    response.completed (or response.incomplete) with usage — or, broken: error, response.failed

Each event is ``event: <type>`` and its JSON (which repeats the type) with a
``sequence_number``; there is no ``[DONE]``. The final Response holds the same items, ids and
text the events built, and is stored (``store``) before ``response.completed`` goes out.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from gateway.doors.base import Rendering
from gateway.doors.responses_translate import (
    function_call_item,
    message_item,
    response_id,
    response_object,
    response_status,
    response_usage,
)
from gateway.errors import GatewayError
from gateway.providers.base import SSEEvent, Usage

JSON = dict[str, Any]


class ResponsesStream:
    def __init__(
        self,
        body: Mapping[str, Any],
        how: Rendering,
        *,
        keep: Callable[[JSON], Awaitable[None]],
    ) -> None:
        self.body = body  # the client's Responses body, echoed in every Response
        self.how = how
        self.keep = keep  # stores the final Response (``store``) before it goes out
        self.id = response_id(how.call_id)
        self._hex = self.id.removeprefix("resp_")
        self.sequence = 0
        self.started = False
        self.output: list[JSON] = []  # the items so far, in order; the last may be open
        self.open: JSON | None = None  # the item deltas go to now
        self.parts: list[JSON] = []  # the open message's content parts
        self.calls: dict[int, JSON] = {}  # a chat tool call's index → its item

    # --- the protocol ------------------------------------------------------------------------

    def feed(self, event: SSEEvent, chunks: list[JSON]) -> bytes:
        out = self._start()
        for chunk in chunks:
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    out += self._text("output_text", delta["content"])
                if delta.get("refusal"):
                    out += self._text("refusal", delta["refusal"])
                for part in delta.get("tool_calls") or ():
                    out += self._arguments(part)
        return b"".join(out)

    async def close(self, usage: Usage | None, finish_reason: str) -> bytes:
        out = self._start()
        status, incomplete = response_status(finish_reason)
        out += self._item_done(status)
        response = self._response(
            status,
            usage=response_usage(usage, self.how.cost(usage)) if usage is not None else None,
            incomplete_details=incomplete,
            completed_at=int(time.time()),
        )
        await self.keep(response)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self._event(kind, response=response))
        return b"".join(out)

    def fail(self, error: GatewayError) -> bytes:
        out = self._start()
        out += self._item_done("incomplete")
        out.append(
            self._event(
                "error",
                code=error.code,
                message=error.message,
                param=error.param,
                reason=error.reason,
            )
        )
        failed = self._response("failed", error={"code": error.code, "message": error.message})
        out.append(self._event("response.failed", response=failed))
        return b"".join(out)

    # --- items -------------------------------------------------------------------------------

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        opening = self._response("in_progress")
        return [
            self._event("response.created", response=opening),
            self._event("response.in_progress", response=opening),
        ]

    def _text(self, kind: str, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open is None or self.open["type"] != "message":
            out += self._item_done("completed")
            self.open = message_item(
                f"msg_{self._hex}_{len(self.output)}",
                text=None,
                refusal=None,
                status="in_progress",
            )
            self.parts = []
            out += self._added(self.open)
        part = self.parts[-1] if self.parts else None
        if part is None or part["type"] != kind:
            part = (
                {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                if kind == "output_text"
                else {"type": "refusal", "refusal": ""}
            )
            self.parts.append(part)
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=self.open["id"],
                    output_index=len(self.output) - 1,
                    content_index=len(self.parts) - 1,
                    part=dict(part),
                )
            )
        field = "text" if kind == "output_text" else "refusal"
        part[field] += text
        delta: JSON = {
            "item_id": self.open["id"],
            "output_index": len(self.output) - 1,
            "content_index": len(self.parts) - 1,
            "delta": text,
        }
        if kind == "output_text":
            delta["logprobs"] = []
        out.append(self._event(f"response.{kind}.delta", **delta))
        return out

    def _arguments(self, part: JSON) -> list[bytes]:
        out: list[bytes] = []
        index = part.get("index", 0)
        function = part.get("function") or {}
        item = self.calls.get(index)
        if item is None:
            out += self._item_done("completed")
            item = function_call_item(
                f"fc_{self._hex}_{len(self.output)}",
                call_id=str(part.get("id") or f"call_{self._hex}_{len(self.output)}"),
                name=str(function.get("name") or ""),
                arguments="",
                status="in_progress",
            )
            self.calls[index] = self.open = item
            out += self._added(item)
        elif function.get("name") and item is self.open:
            item["name"] += function["name"]  # a provider that spells the name in pieces
        arguments = function.get("arguments") or ""
        if arguments and item is self.open:
            item["arguments"] += arguments
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.output.index(item),
                    delta=arguments,
                )
            )
        return out

    def _added(self, item: JSON) -> list[bytes]:
        self.output.append(item)
        added = {**item, "content": []} if item["type"] == "message" else dict(item)
        return [
            self._event("response.output_item.added", output_index=len(self.output) - 1, item=added)
        ]

    def _item_done(self, status: str) -> list[bytes]:
        """Close the open item: its part(s) or arguments done, then the item itself."""
        item, self.open = self.open, None
        if item is None:
            return []
        out: list[bytes] = []
        index = self.output.index(item)
        if item["type"] == "message":
            for content_index, part in enumerate(self.parts):
                kind = part["type"]
                done: JSON = {
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": content_index,
                }
                if kind == "output_text":
                    done.update(text=part["text"], logprobs=[])
                else:
                    done["refusal"] = part["refusal"]
                out.append(self._event(f"response.{kind}.done", **done))
                out.append(
                    self._event(
                        "response.content_part.done",
                        **{
                            "item_id": item["id"],
                            "output_index": index,
                            "content_index": content_index,
                            "part": part,
                        },
                    )
                )
            item["content"] = self.parts
            self.parts = []
            item["status"] = status
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
            item["status"] = "completed"
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    def _response(self, status: str, **fields: Any) -> JSON:
        return response_object(
            self.body,
            id=self.id,
            model=self.how.model,
            created=self.how.created,
            status=status,
            output=[dict(item) for item in self.output],
            provider=self.how.provider,
            **fields,
        )

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = orjson.dumps({"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"
