"""The contract of ``POST /v1/chat/completions``: what a valid body is, as DRF serializers.

JSON types are checked strictly (``"5"`` is not an integer, ``"true"`` is not a boolean), as
OpenAI does: a gateway that coerces silently hides client bugs. Fields the gateway does not
know are passed through to OpenAI-compatible providers untouched.
"""

from __future__ import annotations

from typing import Any

import orjson
from rest_framework import serializers

from gateway.errors import BodyTooLarge, InvalidRequest

ROLES = ("system", "developer", "user", "assistant", "tool")


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "must be an integer."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    default_error_messages = {"invalid": "must be a number."}

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    default_error_messages = {"invalid": "must be a string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


# Free-form JSON (schemas, routing preferences, metadata) is bounded in depth for the whole
# body — orjson refuses to serialise past 254 levels, and deep bodies are slow to walk — and
# each free-form object in size, far above what a provider accepts.
MAX_JSON_DEPTH = 64
MAX_SCHEMA_BYTES = 64 * 1024  # a tool's parameters, a response_format
MAX_PROVIDER_BYTES = 16 * 1024
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's own bounds


class BoundedObjectField(serializers.Field):  # type: ignore[type-arg]
    """A JSON object passed on as it is, of at most ``max_bytes`` once serialised."""

    default_error_messages = {
        "invalid": "must be an object.",
        "too_large": "must be at most {max_bytes} bytes of JSON.",
    }

    def __init__(self, *, max_bytes: int, **kwargs: Any) -> None:
        self.max_bytes = max_bytes
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            self.fail("invalid")
        if len(orjson.dumps(data)) > self.max_bytes:  # depth was bounded before: dumps works
            self.fail("too_large", max_bytes=self.max_bytes)
        return data


class MetadataField(serializers.Field):  # type: ignore[type-arg]
    default_error_messages = {
        "invalid": (
            f"must be an object of at most {MAX_METADATA_PAIRS} string values, keys of at most "
            f"{MAX_METADATA_KEY} and values of at most {MAX_METADATA_VALUE} characters."
        )
    }

    def to_internal_value(self, data: Any) -> Any:
        if not (
            isinstance(data, dict)
            and len(data) <= MAX_METADATA_PAIRS
            and all(
                len(key) <= MAX_METADATA_KEY
                and isinstance(value, str)
                and len(value) <= MAX_METADATA_VALUE
                for key, value in data.items()
            )
        ):
            self.fail("invalid")
        return data


class FunctionSerializer(serializers.Serializer[dict[str, Any]]):
    name = StrictCharField(max_length=64)
    description = StrictCharField(required=False, allow_blank=True)
    parameters = BoundedObjectField(required=False, max_bytes=MAX_SCHEMA_BYTES)
    strict = StrictBooleanField(required=False)


class ToolSerializer(serializers.Serializer[dict[str, Any]]):
    type = serializers.ChoiceField(choices=["function"])
    function = FunctionSerializer()


class ToolCallFunctionSerializer(serializers.Serializer[dict[str, Any]]):
    name = StrictCharField()
    arguments = StrictCharField(allow_blank=True)


class ToolCallSerializer(serializers.Serializer[dict[str, Any]]):
    id = StrictCharField()
    type = serializers.ChoiceField(choices=["function"])
    function = ToolCallFunctionSerializer()


class ContentPartSerializer(serializers.Serializer[dict[str, Any]]):
    type = serializers.ChoiceField(choices=["text", "image_url", "input_audio", "file"])
    text = StrictCharField(required=False, allow_blank=True, trim_whitespace=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["type"] == "text" and "text" not in attrs:
            raise serializers.ValidationError({"text": "a text part needs text."})
        return attrs


# Bounds on list sizes: validation costs about 14 µs per item on the event loop, so a body of
# 200,000 tiny messages (7 MB, under the byte limit) would stall every tenant's requests on
# that worker for seconds. Each bound is far above what a provider accepts.
MAX_MESSAGES = 4096
MAX_TOOLS = 512
MAX_CONTENT_PARTS = 512


class MessageContentField(serializers.Field):  # type: ignore[type-arg]
    """A message's content: a string, a list of parts, or null (assistant tool calls)."""

    default_error_messages = {"invalid": "must be a string or a list of parts."}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, list):
            parts = ContentPartSerializer(data=data, many=True, max_length=MAX_CONTENT_PARTS)
            if not parts.is_valid():
                raise serializers.ValidationError(parts.errors)
        elif not isinstance(data, str):
            self.fail("invalid")
        return data


class MessageSerializer(serializers.Serializer[dict[str, Any]]):
    role = serializers.ChoiceField(choices=ROLES)
    content = MessageContentField(required=False, allow_null=True)
    name = StrictCharField(required=False)
    tool_calls = ToolCallSerializer(many=True, required=False, allow_empty=False)
    tool_call_id = StrictCharField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        role = attrs["role"]
        if attrs.get("content") is None and not (role == "assistant" and attrs.get("tool_calls")):
            raise serializers.ValidationError({"content": "this field is required."})
        if role == "tool" and "tool_call_id" not in attrs:
            raise serializers.ValidationError({"tool_call_id": "a tool message needs one."})
        if "tool_calls" in attrs and role != "assistant":
            raise serializers.ValidationError({"tool_calls": "only assistant messages have them."})
        return attrs


class StreamOptionsSerializer(serializers.Serializer[dict[str, Any]]):
    include_usage = StrictBooleanField(required=False)


class StopField(serializers.Field):  # type: ignore[type-arg]
    default_error_messages = {"invalid": "must be a string or up to 4 strings."}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) or (
            isinstance(data, list) and len(data) <= 4 and all(isinstance(s, str) for s in data)
        ):
            return data
        self.fail("invalid")


class ToolChoiceField(serializers.Field):  # type: ignore[type-arg]
    default_error_messages = {"invalid": "must be none, auto, required or a function choice."}

    def to_internal_value(self, data: Any) -> Any:
        if data in ("none", "auto", "required"):
            return data
        function = data.get("function") if isinstance(data, dict) else None
        if (
            isinstance(data, dict)
            and data.get("type") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
        ):
            return data
        self.fail("invalid")


class ChatCompletionSerializer(serializers.Serializer[dict[str, Any]]):
    model = StrictCharField(max_length=200)
    messages = MessageSerializer(many=True, allow_empty=False, max_length=MAX_MESSAGES)
    stream = StrictBooleanField(required=False)
    stream_options = StreamOptionsSerializer(required=False)
    max_tokens = StrictIntegerField(required=False, min_value=1)
    max_completion_tokens = StrictIntegerField(required=False, min_value=1)
    temperature = StrictFloatField(required=False, min_value=0, max_value=2)
    top_p = StrictFloatField(required=False, min_value=0, max_value=1)
    n = StrictIntegerField(required=False, min_value=1, max_value=1)
    stop = StopField(required=False, allow_null=True)
    tools = ToolSerializer(many=True, required=False, max_length=MAX_TOOLS)
    tool_choice = ToolChoiceField(required=False, allow_null=True)
    user = StrictCharField(required=False, max_length=256)
    response_format = BoundedObjectField(required=False, max_bytes=MAX_SCHEMA_BYTES)
    parallel_tool_calls = StrictBooleanField(required=False)
    provider = BoundedObjectField(required=False, max_bytes=MAX_PROVIDER_BYTES)
    metadata = MetadataField(required=False, allow_null=True)
    models = serializers.ListField(child=StrictCharField(), required=False, max_length=8)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "stream_options" in attrs and not attrs.get("stream"):
            raise serializers.ValidationError(
                {"stream_options": "only allowed when stream is true."}
            )
        return attrs


# DRF deep-copies a serializer's whole field tree for every instance (about 230 µs for this
# one, most of the proxy's CPU per request). The tree holds no per-request state, so one
# instance per process validates every body through ``run_validation``.
_CHAT_COMPLETION = ChatCompletionSerializer()


def chat_request_parse(raw: bytes, *, max_bytes: int) -> dict[str, Any]:
    """The validated request body (the original dict, unknown fields kept), or InvalidRequest."""
    body = json_object_parse(raw, max_bytes=max_bytes)
    if plainly_valid(body):
        return body
    try:
        _CHAT_COMPLETION.run_validation(body)
    except serializers.ValidationError as exc:
        param, message = first_error(exc.detail)
        raise InvalidRequest(f"{param}: {message}", param=param, code="invalid_value") from None
    return body


# The common body — model, plain text messages, the sampling numbers, stream — checked by hand
# in ~5 us where the serializer takes ~120-190 us (5-8 % of the gateway's CPU per request).
# Only an answer of yes is trusted: anything the checks below do not cover (a field of the
# rest, a message with a name or tool calls, a list of parts, a non-ASCII model or user, a
# value out of bounds) goes to the serializer, which accepts it or says what is wrong. Every
# yes here is a yes of the serializer (tests/gateway/test_validation_fast.py, property test).
_PLAIN_ROLES = frozenset({"system", "developer", "user", "assistant"})  # "tool" needs an id
_PLAIN_MESSAGE_KEYS = frozenset({"role", "content"})
_NOT_PLAIN_FIELDS = frozenset(ChatCompletionSerializer().fields) - {
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "n", "user",
}  # fmt: skip
_MAX_INT = 2**63 - 1  # far above any bound, below str()'s digit limit


def plainly_valid(body: dict[str, Any]) -> bool:
    """Whether ``body`` passes ``ChatCompletionSerializer`` by checks cheap enough to run on
    every request; False means only "ask the serializer"."""
    if not _NOT_PLAIN_FIELDS.isdisjoint(body):
        return False
    messages = body.get("messages")
    if not (
        _plain_text(body.get("model"), 200)
        and type(messages) is list
        and 0 < len(messages) <= MAX_MESSAGES
        and all(_plain_message(message) for message in messages)
    ):
        return False
    stream = body.get("stream", False)
    if type(stream) is not bool:
        return False
    if "stream_options" in body:
        options = body["stream_options"]
        if not (
            stream
            and type(options) is dict
            and options.keys() <= {"include_usage"}
            and type(options.get("include_usage", False)) is bool
        ):
            return False
    return (
        _plain_int(body, "max_tokens", 1, _MAX_INT)
        and _plain_int(body, "max_completion_tokens", 1, _MAX_INT)
        and _plain_int(body, "n", 1, 1)
        and _plain_number(body, "temperature", 2)
        and _plain_number(body, "top_p", 1)
        and ("user" not in body or _plain_text(body["user"], 256))
    )


def _plain_text(value: Any, max_length: int) -> bool:
    """What ``StrictCharField(max_length=…)`` accepts, narrowed to ASCII (so no surrogate can
    be in it): a string not blank once trimmed, no NUL, at most ``max_length`` trimmed."""
    if type(value) is not str or not value.isascii() or "\x00" in value:
        return False
    trimmed = value.strip()
    return 0 < len(trimmed) <= max_length


def _plain_message(message: Any) -> bool:
    return (
        type(message) is dict
        and message.keys() == _PLAIN_MESSAGE_KEYS
        and type(message["role"]) is str
        and message["role"] in _PLAIN_ROLES
        and type(message["content"]) is str
    )


def _plain_int(body: dict[str, Any], name: str, low: int, high: int) -> bool:
    value = body.get(name, low)
    return type(value) is int and low <= value <= high


def _plain_number(body: dict[str, Any], name: str, high: float) -> bool:
    value = body.get(name, 0)
    return type(value) in (int, float) and 0 <= value <= high


def json_object_parse(raw: bytes, *, max_bytes: int) -> dict[str, Any]:
    """A body that is one JSON object within the size and depth bounds (every door's), or
    InvalidRequest / BodyTooLarge."""
    if len(raw) > max_bytes:
        raise BodyTooLarge(f"Request body is larger than the limit of {max_bytes} bytes.")
    if not raw:
        raise InvalidRequest("Request body is empty; expected a JSON object.", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"Request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("Request body must be a JSON object.", code="invalid_json")
    if raw.count(b"{") + raw.count(b"[") <= MAX_JSON_DEPTH:
        # A value nested past the bound takes more brackets than that in the body (with the
        # body's own): most bodies hold fewer in all, and need no walk (a bracket inside a
        # string only makes the count larger).
        return body
    for name, value in body.items():  # unknown fields too: they are passed on
        if _deeper_than(value, MAX_JSON_DEPTH - 1):
            raise InvalidRequest(
                f"{name}: nested deeper than {MAX_JSON_DEPTH} levels.",
                param=name,
                code="invalid_value",
            )
    return body


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than ``limit`` levels (iterative: no recursion)."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def first_error(errors: Any, path: str = "") -> tuple[str, str]:
    """The first error of a DRF error tree as (``messages[2].content``, message)."""
    if isinstance(errors, dict):
        name, value = next(iter(errors.items()))
        if isinstance(name, int):  # DRF keys a list's errors by item index
            path = f"{path}[{name}]"
        elif name != "non_field_errors":
            path = f"{path}.{name}" if path else name
        return first_error(value, path)
    if isinstance(errors, list):
        if errors and all(isinstance(item, str) for item in errors):
            return path, str(errors[0])
        for index, item in enumerate(errors):
            if item:
                return first_error(item, f"{path}[{index}]")
    return path, str(errors)
