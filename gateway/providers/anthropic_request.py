"""OpenAI chat-completion request → Anthropic Messages request.

What is translated: system/developer messages → ``system``; user/assistant text and images;
assistant ``tool_calls`` → ``tool_use``; ``tool`` messages → ``tool_result`` in a user turn;
``tools``, ``tool_choice``, ``parallel_tool_calls``, ``max_tokens`` /
``max_completion_tokens``, ``temperature`` (clamped to Anthropic's 0–1), ``top_p``, ``stop``,
``user``, ``stream``; ``cache_control`` on content parts is kept (prompt caching).

Everything else is dropped, because Anthropic rejects unknown fields. The OpenAI fields known to
be dropped are listed in ``DROPPED_FIELDS``; ``n`` > 1 and content Anthropic cannot take
(audio, files, non-function tools) raise ``RequestNotSupported``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.providers.base import JSON, RequestNotSupported

DROPPED_FIELDS = frozenset(
    {
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "seed",
        "service_tier",
        "store",
        "metadata",  # OpenAI's free-form metadata; Anthropic's has only user_id (from ``user``)
        "modalities",
        "audio",
        "prediction",
        "reasoning_effort",
        "verbosity",
        "web_search_options",
        "response_format",  # routes send it only to endpoints that support it (``supports``)
        "stream_options",  # Anthropic always reports usage in the stream
        "functions",  # deprecated; use tools
        "function_call",  # deprecated; use tool_choice
        "prompt_cache_key",
        "safety_identifier",
    }
)

_DATA_URL = re.compile(r"data:(?P<media>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)", re.DOTALL)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text_of(content: Any) -> str:
    """Plain text of a string or a list of text parts (system and developer messages)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and "text" in p]
        return "\n".join(str(p) for p in parts if p)
    return ""


def _with_cache_control(block: JSON, part: JSON) -> JSON:
    if isinstance(part.get("cache_control"), dict):
        block["cache_control"] = part["cache_control"]
    return block


def _image_block(part: JSON) -> JSON:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url:
        raise RequestNotSupported("image_url part without a url")
    if url.startswith("data:"):
        match = _DATA_URL.fullmatch(url)
        if match is None:
            raise RequestNotSupported("image data URLs must be base64")
        source = {"type": "base64", "media_type": match["media"], "data": match["data"]}
    else:
        source = {"type": "url", "url": url}
    return _with_cache_control({"type": "image", "source": source}, part)


def _content_blocks(content: Any) -> list[JSON]:
    """Anthropic blocks for user/tool content: a string or text and image_url parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise RequestNotSupported("message content must be a string or a list of parts")
    blocks: list[JSON] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "refusal") and isinstance(part, dict):
            text = part.get(kind)
            if isinstance(text, str) and text:  # Anthropic rejects empty text blocks
                blocks.append(_with_cache_control({"type": "text", "text": text}, part))
        elif kind == "image_url" and isinstance(part, dict):
            blocks.append(_image_block(part))
        else:
            raise RequestNotSupported(f"content part of type {kind!r} is not supported here")
    return blocks


def tool_input(arguments: Any) -> JSON:
    """``tool_use.input`` from OpenAI's JSON-string arguments.

    Anthropic needs an object. Arguments that are not a JSON object (truncated generations,
    plain text) become ``{}``: the call and its result stay in the history, the garbage does not.
    """
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _assistant_blocks(message: JSON) -> list[JSON]:
    blocks = _content_blocks(message.get("content"))
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise RequestNotSupported("tool_calls must be a list")
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(function, dict):
            raise RequestNotSupported("tool call without a function")
        if not call.get("id") or not function.get("name"):
            raise RequestNotSupported("tool call without an id or a name")
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call["id"]),
                "name": str(function["name"]),
                "input": tool_input(function.get("arguments")),
            }
        )
    return blocks


def _tool_result(message: JSON) -> JSON:
    call_id = message.get("tool_call_id")
    if not call_id:
        raise RequestNotSupported("tool message without tool_call_id")
    block: JSON = {"type": "tool_result", "tool_use_id": str(call_id)}
    content = message.get("content")
    if isinstance(content, str):
        if content:
            block["content"] = content
    else:
        blocks = _content_blocks(content)
        if blocks:
            block["content"] = blocks
    return block


def translate_messages(messages: Any) -> tuple[str, list[JSON]]:
    """``(system, messages)``: system text hoisted; roles strictly alternating (merged)."""
    if not isinstance(messages, list):
        raise RequestNotSupported("messages must be a list")
    system: list[str] = []
    turns: list[JSON] = []
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(message, dict):
            raise RequestNotSupported("each message must be an object")
        if role in ("system", "developer"):
            system.append(_text_of(message.get("content")))
            continue
        if role == "user":
            blocks = _content_blocks(message.get("content"))
        elif role == "assistant":
            blocks = _assistant_blocks(message)
        elif role == "tool":
            role, blocks = "user", [_tool_result(message)]
        else:
            raise RequestNotSupported(f"message role {role!r} is not supported here")
        if not blocks:
            continue  # Anthropic rejects empty turns; merging below keeps the alternation
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    if not turns:  # Anthropic would answer 400; an OpenAI-protocol endpoint may serve it
        raise RequestNotSupported("Anthropic needs a non-empty user or assistant message")
    for turn in turns:
        # Anthropic wants tool results first in their user turn; sort is stable.
        turn["content"].sort(key=lambda block: block["type"] != "tool_result")
    return "\n\n".join(text for text in system if text), turns


def _tools(tools: Any) -> list[JSON]:
    if not isinstance(tools, list):
        raise RequestNotSupported("tools must be a list")
    translated = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise RequestNotSupported("only function tools are supported here")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestNotSupported("function tool without a name")
        schema = function.get("parameters")
        entry: JSON = {
            "name": function["name"],
            "input_schema": schema
            if isinstance(schema, dict)
            else {"type": "object", "properties": {}},
        }
        if isinstance(function.get("description"), str) and function["description"]:
            entry["description"] = function["description"]
        translated.append(entry)
    return translated


def _tool_choice(choice: Any, parallel: Any) -> JSON | None:
    if choice is None or choice == "auto":
        result: JSON = {"type": "auto"}
    elif choice == "none":
        return {"type": "none"}  # Anthropic's "none" takes no parallel flag
    elif choice == "required":
        result = {"type": "any"}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise RequestNotSupported("tool_choice function without a name")
        result = {"type": "tool", "name": name}
    else:
        raise RequestNotSupported(f"tool_choice {choice!r} is not supported here")
    if parallel is False:
        result["disable_parallel_tool_use"] = True
    elif choice is None:
        return None  # nothing to say: Anthropic's default is auto
    return result


def _stop_sequences(stop: Any) -> list[str]:
    values = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    # Anthropic rejects whitespace-only stop sequences.
    return [value for value in values if isinstance(value, str) and value.strip()]


def messages_request(body: JSON, *, upstream_model: str, stream: bool, max_output: int) -> JSON:
    """The Anthropic Messages body for a canonical (OpenAI) body."""
    n = body.get("n")
    if n is not None and n != 1:
        raise RequestNotSupported("n > 1 is not supported by Anthropic")
    system, messages = translate_messages(body.get("messages"))
    max_tokens = next(
        (
            body[key]
            for key in ("max_completion_tokens", "max_tokens")
            if _is_int(body.get(key)) and body[key] > 0
        ),
        max_output,
    )
    wire: JSON = {"model": upstream_model, "messages": messages, "max_tokens": max_tokens}
    if system:
        wire["system"] = system
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and not isinstance(temperature, bool):
        wire["temperature"] = min(max(float(temperature), 0.0), 1.0)
    top_p = body.get("top_p")
    if isinstance(top_p, int | float) and not isinstance(top_p, bool):
        wire["top_p"] = top_p
    stop = _stop_sequences(body.get("stop"))
    if stop:
        wire["stop_sequences"] = stop
    if isinstance(body.get("user"), str) and body["user"]:
        wire["metadata"] = {"user_id": body["user"]}
    if body.get("tools"):
        wire["tools"] = _tools(body["tools"])
        choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
        if choice is not None:
            wire["tool_choice"] = choice
    if stream:
        wire["stream"] = True
    return wire
