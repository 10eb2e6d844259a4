"""The spine's answer as an Anthropic Messages response: translated from the common form
(an OpenAI chat.completion), or the provider's own Messages body when it spoke Anthropic's
protocol (under Switchyard's id and the model's name as asked)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.providers.base import Usage

JSON = dict[str, Any]

# OpenAI finish_reason → Anthropic stop_reason. OpenAI does not say which stop sequence
# matched, so a stop is an end_turn.
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def stop_reason_for(finish_reason: str) -> str:
    return STOP_REASONS.get(finish_reason, "end_turn")


def anthropic_usage(usage: Usage) -> JSON:
    """Anthropic's split: its ``input_tokens`` excludes cache reads (ours include them)."""
    return {
        "input_tokens": usage.input_tokens - usage.cached_input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_input_tokens,
        "output_tokens": usage.output_tokens,
    }


def tool_input_of(arguments: Any) -> Any:
    """``tool_use.input`` from OpenAI's JSON-string arguments: an object, ``{}`` for garbage
    (a truncated generation), so the client's SDK can still parse the block."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def content_blocks(message: JSON) -> list[JSON]:
    blocks: list[JSON] = []
    content = message.get("content")
    if isinstance(content, list):  # some servers answer in parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if isinstance(content, str) and content:
        blocks.append({"type": "text", "text": content})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": tool_input_of(function.get("arguments")),
            }
        )
    return blocks


def message_from_chat(
    completion: JSON, usage: Usage, *, message_id: str, model: str, finish_reason: str
) -> JSON:
    choices = completion.get("choices") or [{}]
    message = choices[0].get("message") or {}
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(message),
        "stop_reason": stop_reason_for(finish_reason),
        "stop_sequence": None,
        "usage": anthropic_usage(usage),
    }


def message_passed_through(native: JSON, *, message_id: str, model: str) -> JSON:
    """The provider's own body: its blocks (thinking, citations …) and usage (cache writes)
    as they are; the id is Switchyard's, for /v1/generation, the model the client's name."""
    return {**native, "id": message_id, "model": model}
