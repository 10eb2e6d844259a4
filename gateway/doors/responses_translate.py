"""The OpenAI Responses protocol (``POST /v1/responses``) and the common chat form, both ways.

A Responses body is validated here and translated to a chat-completions body, which every
adapter serves: ``instructions`` become the system message, ``input`` (a string, or message,
``function_call`` and ``function_call_output`` items) the conversation, function tools and
``tool_choice`` their chat forms, ``text.format`` the ``response_format``,
``max_output_tokens`` the ``max_completion_tokens``. The earlier turns a
``previous_response_id`` names come in as chat messages, put before this turn's input; their
``instructions`` are not carried over, as in OpenAI's API.

Back, a chat answer — its assistant message and usage — becomes the Response's ``output``
items (``message`` with ``output_text`` or ``refusal`` parts, ``function_call``) and its
``usage``. Nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rest_framework import serializers

from gateway.errors import InvalidRequest
from gateway.providers.base import Usage
from gateway.validation import (
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_PROVIDER_BYTES,
    MAX_SCHEMA_BYTES,
    MAX_TOOLS,
    BoundedObjectField,
    MetadataField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    first_error,
    json_object_parse,
)

JSON = dict[str, Any]

INPUT_ROLES = ("user", "assistant", "system", "developer")
ITEM_TYPES = ("message", "function_call", "function_call_output")
# What a stored response's id looks like: ``resp_`` and the generation's hex. Anything else (a
# NUL, which PostgreSQL cannot even compare) is no stored response.
RESPONSE_ID_PREFIX = "resp_"
RESPONSE_ID = re.compile(r"resp_[A-Za-z0-9_-]{1,59}")


class ContentPartSerializer(serializers.Serializer[JSON]):
    type = serializers.ChoiceField(choices=["input_text", "output_text", "refusal", "input_image"])
    text = StrictCharField(required=False, allow_blank=True, trim_whitespace=False)
    refusal = StrictCharField(required=False, allow_blank=True, trim_whitespace=False)
    image_url = StrictCharField(required=False)
    detail = serializers.ChoiceField(choices=["low", "high", "auto"], required=False)

    def validate(self, attrs: JSON) -> JSON:
        kind = attrs["type"]
        if kind in ("input_text", "output_text") and "text" not in attrs:
            raise serializers.ValidationError({"text": f"an {kind} part needs text."})
        if kind == "refusal" and "refusal" not in attrs:
            raise serializers.ValidationError({"refusal": "a refusal part needs its refusal."})
        if kind == "input_image" and "image_url" not in attrs:
            raise serializers.ValidationError(
                {"image_url": "an input_image needs an image_url (file ids are not served)."}
            )
        return attrs


class PartsField(serializers.Field):  # type: ignore[type-arg]
    """A message's content, or a function call's output: a string or a list of parts."""

    default_error_messages = {"invalid": "must be a string or a list of content parts."}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, list):
            parts = ContentPartSerializer(data=data, many=True, max_length=MAX_CONTENT_PARTS)
            if not parts.is_valid():
                raise serializers.ValidationError(parts.errors)
        elif not isinstance(data, str):
            self.fail("invalid")
        return data


class MessageItemSerializer(serializers.Serializer[JSON]):
    type = serializers.ChoiceField(choices=["message"], required=False)
    role = serializers.ChoiceField(choices=INPUT_ROLES)
    content = PartsField()


class FunctionCallItemSerializer(serializers.Serializer[JSON]):
    type = serializers.ChoiceField(choices=["function_call"])
    call_id = StrictCharField(max_length=256)
    name = StrictCharField(max_length=64)
    arguments = StrictCharField(allow_blank=True, trim_whitespace=False)


class FunctionCallOutputItemSerializer(serializers.Serializer[JSON]):
    type = serializers.ChoiceField(choices=["function_call_output"])
    call_id = StrictCharField(max_length=256)
    output = PartsField()


ITEM_SERIALIZERS: dict[str, serializers.Serializer[JSON]] = {
    "message": MessageItemSerializer(),
    "function_call": FunctionCallItemSerializer(),
    "function_call_output": FunctionCallOutputItemSerializer(),
}


class InputField(serializers.Field):  # type: ignore[type-arg]
    """``input``: a string (one user message) or a list of items."""

    default_error_messages = {
        "invalid": "must be a string or a list of items.",
        "empty": "must not be empty.",
        "too_long": f"must have at most {MAX_MESSAGES} items.",
    }

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str):
            return data
        if not isinstance(data, list):
            self.fail("invalid")
        if not data:
            self.fail("empty")
        if len(data) > MAX_MESSAGES:
            self.fail("too_long")
        for index, item in enumerate(data):
            if not isinstance(item, dict):
                raise serializers.ValidationError({index: ["must be an object."]})
            kind = item.get("type", "message")
            serializer = ITEM_SERIALIZERS.get(kind) if isinstance(kind, str) else None
            if serializer is None:
                raise serializers.ValidationError(
                    {index: {"type": [f"must be one of {', '.join(ITEM_TYPES)}."]}}
                )
            try:
                serializer.run_validation(item)
            except serializers.ValidationError as exc:
                raise serializers.ValidationError({index: exc.detail}) from None
        return data


class FunctionToolSerializer(serializers.Serializer[JSON]):
    type = serializers.ChoiceField(
        choices=["function"],
        error_messages={"invalid_choice": "Switchyard serves function tools only."},
    )
    name = StrictCharField(max_length=64)
    description = StrictCharField(required=False, allow_blank=True, allow_null=True)
    parameters = BoundedObjectField(required=False, allow_null=True, max_bytes=MAX_SCHEMA_BYTES)
    strict = StrictBooleanField(required=False, allow_null=True)


class ToolChoiceField(serializers.Field):  # type: ignore[type-arg]
    default_error_messages = {"invalid": "must be none, auto, required or a function choice."}

    def to_internal_value(self, data: Any) -> Any:
        if data in ("none", "auto", "required"):
            return data
        if (
            isinstance(data, dict)
            and data.get("type") == "function"
            and isinstance(data.get("name"), str)
        ):
            return data
        self.fail("invalid")


class FormatSerializer(serializers.Serializer[JSON]):
    type = serializers.ChoiceField(choices=["text", "json_object", "json_schema"])
    name = StrictCharField(required=False, max_length=64)
    schema = BoundedObjectField(required=False, max_bytes=MAX_SCHEMA_BYTES)
    description = StrictCharField(required=False, allow_blank=True)
    strict = StrictBooleanField(required=False, allow_null=True)

    def validate(self, attrs: JSON) -> JSON:
        if attrs["type"] == "json_schema":
            for name in ("name", "schema"):
                if name not in attrs:
                    raise serializers.ValidationError({name: "a json_schema format needs it."})
        return attrs


class TextSerializer(serializers.Serializer[JSON]):
    format = FormatSerializer(required=False)
    verbosity = serializers.ChoiceField(
        choices=["low", "medium", "high"], required=False, allow_null=True
    )


class ResponseCreateSerializer(serializers.Serializer[JSON]):
    model = StrictCharField(max_length=200)
    input = InputField()
    instructions = StrictCharField(
        required=False, allow_null=True, allow_blank=True, trim_whitespace=False
    )
    previous_response_id = StrictCharField(required=False, allow_null=True, max_length=64)
    store = StrictBooleanField(required=False, allow_null=True)
    stream = StrictBooleanField(required=False, allow_null=True)
    background = StrictBooleanField(required=False, allow_null=True)
    tools = FunctionToolSerializer(many=True, required=False, max_length=MAX_TOOLS)
    tool_choice = ToolChoiceField(required=False, allow_null=True)
    parallel_tool_calls = StrictBooleanField(required=False, allow_null=True)
    text = TextSerializer(required=False, allow_null=True)
    max_output_tokens = StrictIntegerField(required=False, allow_null=True, min_value=1)
    temperature = StrictFloatField(required=False, allow_null=True, min_value=0, max_value=2)
    top_p = StrictFloatField(required=False, allow_null=True, min_value=0, max_value=1)
    user = StrictCharField(required=False, allow_null=True, max_length=256)
    safety_identifier = StrictCharField(required=False, allow_null=True, max_length=256)
    prompt_cache_key = StrictCharField(required=False, allow_null=True, max_length=256)
    metadata = MetadataField(required=False, allow_null=True)
    provider = BoundedObjectField(required=False, max_bytes=MAX_PROVIDER_BYTES)
    models = serializers.ListField(child=StrictCharField(), required=False, max_length=8)

    def validate(self, attrs: JSON) -> JSON:
        if attrs.get("background"):
            raise serializers.ValidationError(
                {"background": "not served; send 'Prefer: respond-async' for a deferred job."}
            )
        return attrs


# One instance per process: DRF deep-copies the field tree per instance (gateway/validation.py).
_RESPONSE_CREATE = ResponseCreateSerializer()


def responses_request_parse(raw: bytes, *, max_bytes: int) -> JSON:
    """The validated Responses body (the client's dict), or InvalidRequest naming the field."""
    body = json_object_parse(raw, max_bytes=max_bytes)
    try:
        _RESPONSE_CREATE.run_validation(body)
    except serializers.ValidationError as exc:
        param, message = first_error(exc.detail)
        raise InvalidRequest(f"{param}: {message}", param=param, code="invalid_value") from None
    return body


def input_messages(input_: str | Sequence[JSON]) -> list[JSON]:
    """This turn's ``input`` as chat messages (a validated body's)."""
    if isinstance(input_, str):
        return [{"role": "user", "content": input_}]
    messages: list[JSON] = []
    for item in input_:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": _chat_content(item["content"])})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            # A model's turn is one assistant message: its text and the calls it made.
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:  # function_call_output
            output = item["output"]
            content = output if isinstance(output, str) else _chat_content(output)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
    return messages


def _chat_content(content: str | Sequence[JSON]) -> str | list[JSON]:
    if isinstance(content, str):
        return content
    parts: list[JSON] = []
    for part in content:
        kind = part["type"]
        if kind == "input_image":
            image = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:  # input_text, output_text, refusal
            parts.append({"type": "text", "text": part["refusal" if kind == "refusal" else "text"]})
    return parts


def chat_body(body: Mapping[str, Any], conversation: Sequence[JSON]) -> JSON:
    """The chat-completions body for a validated Responses ``body``; ``conversation`` is the
    earlier turns' messages and this turn's input (``input_messages``)."""
    messages: list[JSON] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    messages.extend(conversation)
    chat: JSON = {"model": body["model"], "messages": messages}
    if body.get("tools"):
        chat["tools"] = [_chat_tool(tool) for tool in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        chat["tool_choice"] = choice
    response_format = _response_format(((body.get("text") or {}).get("format")) or {})
    if response_format is not None:
        chat["response_format"] = response_format
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if body.get(name) is not None:
            chat[name] = body[name]
    user = body.get("user") or body.get("safety_identifier")
    if user:
        chat["user"] = user
    for name in ("provider", "models"):  # Switchyard's routing fields, as on chat (G13)
        if name in body:
            chat[name] = body[name]
    if body.get("stream"):
        chat["stream"] = True
    return chat


def _chat_tool(tool: Mapping[str, Any]) -> JSON:
    function: JSON = {"name": tool["name"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    if tool.get("parameters") is not None:
        function["parameters"] = tool["parameters"]
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _response_format(format_: Mapping[str, Any]) -> JSON | None:
    kind = format_.get("type", "text")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema: JSON = {"name": format_["name"], "schema": format_["schema"]}
        for name in ("description", "strict"):
            if format_.get(name) is not None:
                schema[name] = format_[name]
        return {"type": "json_schema", "json_schema": schema}
    return None


# --- back: a chat answer as a Response -------------------------------------------------------


def response_id(call_id: str) -> str:
    """A Response's id from its generation's (``gen-<hex>`` → ``resp_<hex>``): one name each
    for the client's API and the ledger's, and either finds the other."""
    return RESPONSE_ID_PREFIX + call_id.removeprefix("gen-")


def message_item(item_id: str, *, text: str | None, refusal: str | None, status: str) -> JSON:
    content: list[JSON] = []
    if text:
        content.append({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    if refusal:
        content.append({"type": "refusal", "refusal": refusal})
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def function_call_item(
    item_id: str, *, call_id: str, name: str, arguments: str, status: str
) -> JSON:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def output_items(message: Mapping[str, Any], *, response: str, status: str) -> list[JSON]:
    """A chat answer's assistant message as output items (ids derived from the response's)."""
    items: list[JSON] = []
    hex_ = response.removeprefix(RESPONSE_ID_PREFIX)
    text = message.get("content")
    refusal = message.get("refusal")
    if text or refusal:
        items.append(
            message_item(
                f"msg_{hex_}_0",
                text=text if isinstance(text, str) else None,
                refusal=refusal if isinstance(refusal, str) else None,
                status=status,
            )
        )
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(
            function_call_item(
                f"fc_{hex_}_{len(items)}",
                call_id=str(call.get("id") or f"call_{hex_}_{len(items)}"),
                name=str(function.get("name", "")),
                arguments=str(function.get("arguments") or ""),
                status="completed",
            )
        )
    return items


def assistant_message(items: Sequence[Mapping[str, Any]]) -> JSON:
    """Output items as the chat message a later turn sends back (``previous_response_id``)."""
    text = "".join(
        part.get("text", "")
        for item in items
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in items
        if item["type"] == "function_call"
    ]
    message: JSON = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


# Chat's finish reasons that leave a Response incomplete, and why (OpenAI's words).
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def response_status(finish_reason: str) -> tuple[str, JSON | None]:
    """(status, incomplete_details) of a Response whose generation ended so."""
    why = INCOMPLETE.get(finish_reason)
    return ("incomplete", {"reason": why}) if why else ("completed", None)


def response_usage(usage: Usage, cost: float) -> JSON:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
        "cost": cost,  # Switchyard's, as on chat's usage (USD)
    }


def response_object(
    body: Mapping[str, Any],
    *,
    id: str,
    model: str,
    created: int,
    status: str,
    output: list[JSON],
    usage: JSON | None = None,
    incomplete_details: JSON | None = None,
    error: JSON | None = None,
    completed_at: int | None = None,
    stored: bool = False,
    provider: str | None = None,
) -> JSON:
    """A Response object; the request's own settings (``body``) are echoed as OpenAI does."""
    text = body.get("text") or {}
    response: JSON = {
        "id": id,
        "object": "response",
        "created_at": created,
        "status": status,
        "completed_at": completed_at,
        "error": error,
        "incomplete_details": incomplete_details,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": stored,
        "temperature": body.get("temperature"),
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": list(body.get("tools") or ()),
        "top_p": body.get("top_p"),
        "truncation": "disabled",
        "usage": usage,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }
    if provider is not None:
        response["provider"] = provider
    return response
