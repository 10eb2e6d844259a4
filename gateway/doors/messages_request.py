"""The contract of ``POST /v1/messages`` (Anthropic Messages): a valid body, and its
translation to the spine's common form, an OpenAI chat-completions body.

Validation checks what the spine and both back doors rely on, with JSON types strict (as
Anthropic is: ``"5"`` is not an integer); fields it does not know are kept in the native body,
which goes as it is to an Anthropic-protocol endpoint (``cache_control``, ``thinking``, betas).

The translation is what an OpenAI-protocol endpoint can be told:
- ``system`` (a string or text blocks) → a leading ``system`` message, and a ``system`` turn
  among the messages (Claude Code sends some) → a ``system`` message in its place;
- text and image blocks → content parts (``cache_control`` kept on them, so a request that
  round-trips through the common form to Anthropic keeps its cache hints);
- ``tool_use`` blocks → the assistant's ``tool_calls``; ``tool_result`` blocks → ``tool``
  messages, placed before the rest of their user turn, as OpenAI wants them right after the
  calls;
- ``tools`` (custom tools) → function tools; ``tool_choice`` auto/any/tool/none →
  auto/required/function/none, ``disable_parallel_tool_use`` → ``parallel_tool_calls``;
- ``stop_sequences`` → ``stop``; ``metadata.user_id`` → ``user``; ``max_tokens``,
  ``temperature``, ``top_p``, ``stream``.
Documents become ``file`` parts (base64, a PDF) or text. Thinking blocks (and
``redacted_thinking``) have no chat-completions form and are dropped, as are documents by URL
and server tools (web search, code execution …), which only Anthropic can run.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.validation import (
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_SCHEMA_BYTES,
    MAX_TOOLS,
)

JSON = dict[str, Any]

IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
MAX_STOP_SEQUENCES = 64
THINKING_TYPES = ("enabled", "adaptive", "disabled")


def _fail(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param, code="invalid_value")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _string(body: JSON, name: str, param: str, *, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise _fail(param, "must be a string." if name in body else "this field is required.")
    return value


def _validate_block(block: Any, param: str, *, role: str) -> None:
    if not isinstance(block, dict):
        raise _fail(param, "must be a content block (an object).")
    kind = block.get("type")
    if not isinstance(kind, str) or not kind:
        raise _fail(f"{param}.type", "a content block names its type.")
    if kind == "text" and not isinstance(block.get("text"), str):
        raise _fail(f"{param}.text", "a text block needs text (a string).")
    if kind == "image":
        source = block.get("source")
        if not isinstance(source, dict) or source.get("type") not in ("base64", "url"):
            raise _fail(f"{param}.source", "must be a base64 or url image source.")
        if source["type"] == "base64":
            if source.get("media_type") not in IMAGE_MEDIA_TYPES:
                raise _fail(f"{param}.source.media_type", "must be an image media type.")
            if not isinstance(source.get("data"), str):
                raise _fail(f"{param}.source.data", "must be a base64 string.")
        elif not isinstance(source.get("url"), str):
            raise _fail(f"{param}.source.url", "must be a string.")
    if kind == "tool_use":
        if role != "assistant":
            raise _fail(param, "tool_use blocks belong to assistant messages.")
        for name in ("id", "name"):
            if not isinstance(block.get(name), str) or not block[name]:
                raise _fail(f"{param}.{name}", "must be a non-empty string.")
        if not isinstance(block.get("input"), dict):
            raise _fail(f"{param}.input", "must be an object.")
    if kind == "tool_result":
        if role != "user":
            raise _fail(param, "tool_result blocks belong to user messages.")
        if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
            raise _fail(f"{param}.tool_use_id", "must be a non-empty string.")
        content = block.get("content")
        if isinstance(content, list):
            _validate_blocks(content, f"{param}.content", role="tool")
        elif content is not None and not isinstance(content, str):
            raise _fail(f"{param}.content", "must be a string or a list of blocks.")
    if "cache_control" in block and not isinstance(block["cache_control"], dict):
        raise _fail(f"{param}.cache_control", "must be an object.")


def _validate_blocks(blocks: list[Any], param: str, *, role: str) -> None:
    if len(blocks) > MAX_CONTENT_PARTS:
        raise _fail(param, f"at most {MAX_CONTENT_PARTS} blocks.")
    for index, block in enumerate(blocks):
        _validate_block(block, f"{param}[{index}]", role=role)


def _validate_system(blocks: list[Any], param: str) -> None:
    if len(blocks) > MAX_CONTENT_PARTS:
        raise _fail(param, f"at most {MAX_CONTENT_PARTS} blocks.")
    for index, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _fail(f"{param}[{index}]", "system blocks are text blocks.")
        if not isinstance(block.get("text"), str):
            raise _fail(f"{param}[{index}].text", "must be a string.")


def _validate_tools(tools: Any) -> None:
    if not isinstance(tools, list):
        raise _fail("tools", "must be a list.")
    if len(tools) > MAX_TOOLS:
        raise _fail("tools", f"at most {MAX_TOOLS} tools.")
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise _fail(param, "must be an object.")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _fail(f"{param}.name", "must be a non-empty string.")
        if tool.get("type") not in (None, "custom"):
            continue  # a server tool (web_search_…): Anthropic checks its own fields
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise _fail(f"{param}.input_schema", "must be an object (a JSON schema).")
        if len(orjson.dumps(schema)) > MAX_SCHEMA_BYTES:
            raise _fail(f"{param}.input_schema", f"must be at most {MAX_SCHEMA_BYTES} bytes.")
        if "description" in tool and not isinstance(tool["description"], str):
            raise _fail(f"{param}.description", "must be a string.")


def _validate_tool_choice(choice: Any) -> None:
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise _fail("tool_choice", "must be an object of type auto, any, tool or none.")
    if choice["type"] == "tool" and not isinstance(choice.get("name"), str):
        raise _fail("tool_choice.name", "a tool choice names its tool.")
    flag = choice.get("disable_parallel_tool_use")
    if flag is not None and not isinstance(flag, bool):
        raise _fail("tool_choice.disable_parallel_tool_use", "must be a boolean.")


def messages_validate(body: JSON) -> JSON:
    """The body if it is a valid Messages request, else ``InvalidRequest`` naming the field."""
    _string(body, "model", "model", required=True)
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _fail("max_tokens", "must be a positive integer.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("messages", "must be a non-empty list.")
    if len(messages) > MAX_MESSAGES:
        raise _fail("messages", f"at most {MAX_MESSAGES} messages.")
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _fail(param, "must be an object.")
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise _fail(f"{param}.role", "must be 'user', 'assistant' or 'system'.")
        content = message.get("content")
        if role == "system" and isinstance(content, list):
            _validate_system(content, f"{param}.content")
        elif isinstance(content, list):
            _validate_blocks(content, f"{param}.content", role=role)
        elif not isinstance(content, str):
            raise _fail(f"{param}.content", "must be a string or a list of content blocks.")
    system = body.get("system")
    if isinstance(system, list):
        _validate_system(system, "system")
    elif system is not None and not isinstance(system, str):
        raise _fail("system", "must be a string or a list of text blocks.")
    if "tools" in body:
        _validate_tools(body["tools"])
    if "tool_choice" in body:
        _validate_tool_choice(body["tool_choice"])
    stop = body.get("stop_sequences")
    if stop is not None and not (
        isinstance(stop, list)
        and len(stop) <= MAX_STOP_SEQUENCES
        and all(isinstance(s, str) for s in stop)
    ):
        raise _fail("stop_sequences", f"must be a list of at most {MAX_STOP_SEQUENCES} strings.")
    for name, high in (("temperature", 1.0), ("top_p", 1.0)):
        value = body.get(name)
        if value is not None and (not _is_number(value) or not 0 <= value <= high):
            raise _fail(name, f"must be a number between 0 and {high:g}.")
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < 0):
        raise _fail("top_k", "must be a non-negative integer.")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _fail("stream", "must be a boolean.")
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise _fail("metadata", "must be an object.")
        user_id = metadata.get("user_id")
        if user_id is not None and (not isinstance(user_id, str) or len(user_id) > 512):
            raise _fail("metadata.user_id", "must be a string of at most 512 characters.")
    thinking = body.get("thinking")
    if thinking is not None:
        if not isinstance(thinking, dict) or thinking.get("type") not in THINKING_TYPES:
            raise _fail("thinking", "must be an object of type enabled, adaptive or disabled.")
        budget = thinking.get("budget_tokens")
        if thinking["type"] == "enabled" and not (isinstance(budget, int) and budget >= 1):
            raise _fail("thinking.budget_tokens", "must be a positive integer.")
    return body


# --- Messages → chat completions -----------------------------------------------------------


def _cache(part: JSON, block: JSON) -> JSON:
    if isinstance(block.get("cache_control"), dict):
        part["cache_control"] = block["cache_control"]
    return part


def _image_part(block: JSON) -> JSON:
    source = block["source"]
    if source["type"] == "base64":
        url = f"data:{source['media_type']};base64,{source['data']}"
    else:
        url = source["url"]
    return _cache({"type": "image_url", "image_url": {"url": url}}, block)


def _document_parts(block: JSON) -> list[JSON]:
    """A document as OpenAI's parts: a base64 file (a PDF) as a ``file`` part, plain text as
    text. A document by URL or by file id has no chat-completions form: it is dropped."""
    source = block.get("source")
    if not isinstance(source, dict):
        return []
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type") or "application/pdf"
        name = block.get("title") if isinstance(block.get("title"), str) else "document.pdf"
        data = f"data:{media};base64,{source['data']}"
        return [{"type": "file", "file": {"filename": name, "file_data": data}}]
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return [{"type": "text", "text": source["data"]}]
    return []


def _parts(blocks: list[JSON]) -> list[JSON]:
    """Text, image and document blocks as chat content parts. Tool blocks are the caller's;
    the others (thinking, server tool use and results, types Anthropic adds later) are
    Anthropic's alone: they reach an Anthropic-protocol endpoint as they are, and are left
    out of the common form."""
    parts = []
    for block in blocks:
        if block["type"] == "text":
            parts.append(_cache({"type": "text", "text": block["text"]}, block))
        elif block["type"] == "image":
            parts.append(_image_part(block))
        elif block["type"] == "document":
            parts.extend(_document_parts(block))
        elif block["type"] == "search_result":
            text = "\n".join(
                str(item.get("text", ""))
                for item in block.get("content") or ()
                if isinstance(item, dict)
            )
            parts.append({"type": "text", "text": text})
    return parts


def _content(parts: list[JSON]) -> str | list[JSON]:
    """A plain string when the parts are text without cache hints: the common case, and the
    form every OpenAI-compatible server takes (separate blocks stay separate lines)."""
    if all(p["type"] == "text" and "cache_control" not in p for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _tool_result_message(block: JSON) -> JSON:
    content = block.get("content")
    if isinstance(content, list):
        parts = _parts(content)
        # OpenAI's tool messages take text only; an image in a tool result has no place.
        text = "\n".join(p["text"] for p in parts if p["type"] == "text")
    else:
        text = content or ""
    if block.get("is_error") is True:
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _user_messages(content: str | list[JSON]) -> list[JSON]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results = [_tool_result_message(b) for b in content if b["type"] == "tool_result"]
    parts = _parts(content)
    if parts or not results:
        results.append({"role": "user", "content": _content(parts)})
    return results


def _assistant_message(content: str | list[JSON]) -> JSON:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    message: JSON = {"role": "assistant", "content": _content(_parts(content)) or None}
    calls = [
        {
            "id": block["id"],
            "type": "function",
            "function": {
                "name": block["name"],
                "arguments": orjson.dumps(block["input"]).decode(),
            },
        }
        for block in content
        if block["type"] == "tool_use"
    ]
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return message


def _system_message(system: Any) -> JSON | None:
    if isinstance(system, str):
        return {"role": "system", "content": system} if system else None
    if isinstance(system, list) and system:
        parts = [_cache({"type": "text", "text": b["text"]}, b) for b in system]
        return {"role": "system", "content": _content(parts)}
    return None


def _function_tools(tools: list[JSON]) -> list[JSON]:
    functions = []
    for tool in tools:
        if tool.get("type") not in (None, "custom"):
            continue
        function: JSON = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: JSON) -> str | JSON:
    kind = choice["type"]
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice["name"]}}
    return str(kind)  # auto, none


def chat_body(native: JSON) -> JSON:
    """The common (OpenAI chat-completions) form of a validated Messages body."""
    messages: list[JSON] = []
    system = _system_message(native.get("system"))
    if system is not None:
        messages.append(system)
    for message in native["messages"]:
        if message["role"] == "system":  # Claude Code sends instructions in the turns too
            turn = _system_message(message["content"])
            messages.extend([turn] if turn else [])
        elif message["role"] == "user":
            messages.extend(_user_messages(message["content"]))
        else:
            messages.append(_assistant_message(message["content"]))
    body: JSON = {
        "model": native["model"],
        "messages": messages,
        "max_tokens": native["max_tokens"],
    }
    for name in ("temperature", "top_p"):
        if native.get(name) is not None:
            body[name] = native[name]
    if native.get("stop_sequences"):
        body["stop"] = native["stop_sequences"]
    user_id = (native.get("metadata") or {}).get("user_id")
    if user_id:
        body["user"] = user_id
    tools = _function_tools(native.get("tools") or [])
    if tools:
        body["tools"] = tools
        choice = native.get("tool_choice")
        if isinstance(choice, dict):
            body["tool_choice"] = _tool_choice(choice)
            if choice.get("disable_parallel_tool_use") is True and choice["type"] != "none":
                body["parallel_tool_calls"] = False
    if native.get("stream") is True:
        body["stream"] = True
    return body
