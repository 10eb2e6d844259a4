"""The Anthropic Messages wire protocol: requests, answers, SSE events, errors, headers."""

from __future__ import annotations

import random
from typing import Any

import orjson

from simulator.model import (
    LimitStatus,
    Plan,
    ProviderSpec,
    Rejection,
    ToolSpec,
    count_prompt_tokens,
)
from simulator.model.limits import DimensionStatus
from simulator.model.request import CompletionRequest
from simulator.server.common import (
    BadRequest,
    Content,
    Headers,
    Parsed,
    Response,
    caller_of,
    count_images,
    load_json_object,
    make_id,
    optional_int,
    requests_dimension,
    rfc3339,
    stop_list,
    text_of,
    tokens_dimension,
)

STOP_REASONS = {
    "end": "end_turn",
    "max_tokens": "max_tokens",
    "tool_use": "tool_use",
    "stop_sequence": "stop_sequence",
}
ORGANIZATION = "org-simulator"
MIN_THINKING_BUDGET = 1024
RATE_LIMITS_URL = "https://docs.claude.com/en/api/rate-limits"
_FAILURES = {500: ("api_error", "Internal server error"), 529: ("overloaded_error", "Overloaded")}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_PER_MINUTE_WORDS = {
    "requests_per_minute": "requests",
    "input_tokens_per_minute": "input tokens",
    "output_tokens_per_minute": "output tokens",
}


class AnthropicWire:
    protocol = "anthropic"
    completion_path = "/v1/messages"
    tool_id_prefix = "toolu_01"

    def __init__(self, spec: ProviderSpec, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng

    # -- requests ----------------------------------------------------------------------------

    def authenticate(self, headers: dict[str, str]) -> Response | None:
        scheme, _, bearer = headers.get("authorization", "").partition(" ")
        if headers.get("x-api-key", "").strip() or (scheme.lower() == "bearer" and bearer.strip()):
            return None
        return self.error(401, "x-api-key header is required")

    def api_key(self, headers: dict[str, str]) -> str:
        """The key a request came with (after ``authenticate`` let it through)."""
        key = headers.get("x-api-key", "").strip()
        return key or headers.get("authorization", "").partition(" ")[2].strip()

    def key_refused(self, shown: str) -> Response:
        """401 for a key the organisation does not have (revoked or never issued)."""
        del shown  # Anthropic does not echo the key
        return self.error(401, "invalid x-api-key")

    def parse(self, headers: dict[str, str], body: bytes) -> Parsed:
        if not headers.get("anthropic-version", "").strip():
            raise BadRequest("anthropic-version: header is required")
        data = load_json_object(body)
        model = data.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model: Field required")
        max_tokens = optional_int(data, "max_tokens")
        if max_tokens is None:
            raise BadRequest("max_tokens: Field required")
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: Field required")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                raise BadRequest(f"messages.{index}.role: Input should be 'user' or 'assistant'")
        tools = _tools(data.get("tools"))
        tool_choice = _tool_choice(data.get("tool_choice"), tools)
        thinking_budget = _thinking_budget(data.get("thinking"), max_tokens)
        if thinking_budget is not None and tool_choice not in ("auto", "none"):
            raise BadRequest("Thinking may not be enabled when tool_choice forces tool use.")
        texts = [text_of(data.get("system"))] if data.get("system") else []
        texts += [text_of(message.get("content")) for message in messages]
        request = CompletionRequest(
            model=model,
            input_tokens=count_prompt_tokens(texts, tools, images=count_images(messages)),
            max_tokens=max_tokens,
            tools=tools,
            tool_choice=tool_choice,
            stop_sequences=stop_list(data.get("stop_sequences"), "stop_sequences"),
            cache_control=b'"cache_control"' in body,
            follows_tool_result=_has_tool_result(messages[-1]),
            response_schema=_output_schema(data),
            thinking_budget=thinking_budget,
        )
        metadata = data.get("metadata")
        caller = caller_of(metadata.get("user_id")) if isinstance(metadata, dict) else None
        return Parsed(request, stream=bool(data.get("stream")), caller=caller)

    # -- answers -----------------------------------------------------------------------------

    def completion(self, plan: Plan, content: Content, now: float) -> bytes:
        return orjson.dumps(
            {
                "id": make_id(self.rng, "msg_01"),
                "type": "message",
                "role": "assistant",
                "model": plan.model,
                "content": [*thinking_blocks(content), content_block(plan, content, complete=True)],
                "stop_reason": STOP_REASONS[plan.stop_reason],
                "stop_sequence": plan.stop_sequence,
                "usage": usage(plan, plan.output_tokens),
            }
        )

    def stream(self, plan: Plan, content: Content, parsed: Parsed, now: float) -> AnthropicStream:
        return AnthropicStream(plan, content, make_id(self.rng, "msg_01"))

    def models(self) -> bytes:
        data = [_model_info(name) for name in self.spec.models]
        names = list(self.spec.models)
        return orjson.dumps(
            {"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}
        )

    def model(self, name: str) -> Response:
        if name not in self.spec.models:
            return self.model_not_found(name)
        return Response(200, [], orjson.dumps(_model_info(name)))

    # -- errors and headers ------------------------------------------------------------------

    def error(
        self,
        status: int,
        message: str,
        *,
        headers: Headers | None = None,
        detail_code: str | None = None,
    ) -> Response:
        error: dict[str, Any] = {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}
        if detail_code is not None:
            error["details"] = {"error_code": detail_code}
        request_id = make_id(self.rng, "req_011")
        body = {"type": "error", "error": error, "request_id": request_id}
        return Response(status, headers or [], orjson.dumps(body), request_id)

    def bad_request(self, error: BadRequest) -> Response:
        return self.error(error.status, error.message)

    def model_not_found(self, model: str) -> Response:
        return self.error(404, f"model: {model}")

    def not_found(self, path: str) -> Response:
        return self.error(404, "Not Found")

    def rejection(self, rejection: Rejection, model: str, now: float) -> Response:
        reason = rejection.reason
        if reason == "model_not_found":
            return self.model_not_found(model)
        if reason == "context_length_exceeded":
            message = (
                f"prompt is too long: {rejection.requested} tokens > {rejection.limit} maximum"
            )
            return self.error(400, message)
        headers = self.limit_headers(rejection.limits, now)
        if reason == "requests_per_day":
            headers.append(("x-should-retry", "false"))
            message = (
                f"You have reached your daily request limit of {rejection.limit} requests. "
                "Your usage limit resets at 00:00 UTC; requests will fail until then."
            )
            return self.error(
                429, message, headers=headers, detail_code="daily_request_limit_reached"
            )
        if reason == "request_too_large":
            headers.append(("x-should-retry", "false"))
            message = (
                f"This request would exceed your organization's rate limit of {rejection.limit} "
                f"tokens per minute on its own (it asks for {rejection.requested}). Please reduce "
                f"the prompt length or the maximum tokens requested. See {RATE_LIMITS_URL}."
            )
            return self.error(
                429, message, headers=headers, detail_code="request_exceeds_rate_limit"
            )
        headers.append(("retry-after", str(rejection.retry_after_header or 1)))
        if reason == "concurrency":
            what = f"{rejection.limit} concurrent requests"
        else:
            what = f"{rejection.limit} {_PER_MINUTE_WORDS.get(reason, 'tokens')} per minute"
        message = (
            f"This request would exceed the rate limit for your organization ({ORGANIZATION}) of "
            f"{what}. For details, refer to: {RATE_LIMITS_URL}. You can see the response headers "
            "for current usage. Please reduce the prompt length or the maximum tokens requested, "
            "or try again later."
        )
        return self.error(429, message, headers=headers)

    def failure(self, status: int, headers: Headers) -> Response:
        return self.error(status, _FAILURES.get(status, ("api_error", "Error"))[1], headers=headers)

    def failure_event(self, status: int) -> bytes:
        kind, message = _FAILURES.get(status, ("api_error", "Internal server error"))
        body = {"type": "error", "error": {"type": kind, "message": message}}
        return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"

    def limit_headers(self, status: LimitStatus, now: float) -> Headers:
        headers: Headers = []
        families: tuple[tuple[str, DimensionStatus | None, bool], ...] = (
            ("requests", requests_dimension(status), False),
            ("input-tokens", status.get("input_tokens"), True),
            ("output-tokens", status.get("output_tokens"), True),
            ("tokens", tokens_dimension(status), True),
        )
        for family, dimension, rounded in families:
            if dimension is None:
                continue
            remaining = dimension.remaining
            if rounded:  # Anthropic rounds token remainders to the nearest thousand
                remaining = min(dimension.limit, (remaining + 500) // 1000 * 1000)
            headers += [
                (f"anthropic-ratelimit-{family}-limit", str(dimension.limit)),
                (f"anthropic-ratelimit-{family}-remaining", str(remaining)),
                (f"anthropic-ratelimit-{family}-reset", rfc3339(now + dimension.reset_s)),
            ]
        return headers

    def request_headers(self, processing_s: float, request_id: str | None = None) -> Headers:
        return [
            ("request-id", request_id or make_id(self.rng, "req_011")),
            ("anthropic-organization-id", ORGANIZATION),
        ]


class AnthropicStream:
    """Messages SSE events for one plan: the thinking block (when asked for) at index 0, then the
    answer's block; ``tokens`` closes the thinking block once it reaches the answer's pieces."""

    def __init__(self, plan: Plan, content: Content, message_id: str) -> None:
        self.plan = plan
        self.content = content
        self.message_id = message_id
        self.tool = plan.tool_call is not None
        self.answer_index = 1 if content.thinking else 0
        self._answering = not content.thinking

    def head(self) -> bytes:
        plan = self.plan
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": plan.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(plan, 1),
        }
        return _event("message_start", {"type": "message_start", "message": message})

    def first_token(self) -> bytes:
        if self.content.thinking:
            block: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            block = content_block(self.plan, self.content, complete=False)
        start = {"type": "content_block_start", "index": 0, "content_block": block}
        return _event("content_block_start", start) + b'event: ping\ndata: {"type": "ping"}\n\n'

    def tokens(self, start: int, end: int, group: int) -> bytes:
        out = []
        boundary = self.content.thinking
        if start < boundary:
            out.append(self._deltas(start, min(end, boundary), group, b"thinking_delta", 0))
        if end > boundary:
            if not self._answering:
                out.append(self._answer_start())
            kind = b"input_json_delta" if self.tool else b"text_delta"
            out.append(self._deltas(max(start, boundary), end, group, kind, self.answer_index))
        return b"".join(out)

    def _deltas(self, start: int, end: int, group: int, kind: bytes, index: int) -> bytes:
        field = {b"thinking_delta": b"thinking", b"input_json_delta": b"partial_json"}
        name = field.get(kind, b"text")
        out = []
        for first in range(start, end, group):
            text = "".join(self.content.pieces[first : min(end, first + group)])
            if not text:
                continue
            out.append(
                b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
                b'"delta":{"type":"%b","%b":%b}}\n\n' % (index, kind, name, orjson.dumps(text))
            )
        return b"".join(out)

    def _answer_start(self) -> bytes:
        """The thinking block's signature and end, and the start of the answer's block."""
        self._answering = True
        signature = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": self.content.signature},
        }
        start = {
            "type": "content_block_start",
            "index": self.answer_index,
            "content_block": content_block(self.plan, self.content, complete=False),
        }
        return b"".join(
            (
                _event("content_block_delta", signature),
                _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
                _event("content_block_start", start),
            )
        )

    def tail(self) -> bytes:
        plan = self.plan
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": STOP_REASONS[plan.stop_reason],
                "stop_sequence": plan.stop_sequence,
            },
            "usage": {"output_tokens": plan.output_tokens},
        }
        stop = {"type": "content_block_stop", "index": self.answer_index}
        return b"".join(
            (
                b"" if self._answering else self._answer_start(),
                _event("content_block_stop", stop),
                _event("message_delta", delta),
                _event("message_stop", {"type": "message_stop"}),
            )
        )


def thinking_blocks(content: Content) -> list[dict[str, Any]]:
    if not content.thinking:
        return []
    return [{"type": "thinking", "thinking": content.thinking_text, "signature": content.signature}]


def content_block(plan: Plan, content: Content, *, complete: bool) -> dict[str, Any]:
    call = plan.tool_call
    if call is None:
        return {"type": "text", "text": content.text if complete else ""}
    tool_input: Any = {}
    if complete:
        try:
            tool_input = orjson.loads(content.text)
        except orjson.JSONDecodeError:
            tool_input = {}  # cut off by max_tokens: the API sends what it could parse
    return {"type": "tool_use", "id": content.tool_call_id, "name": call.name, "input": tool_input}


def usage(plan: Plan, output_tokens: int) -> dict[str, Any]:
    uncached = plan.input_tokens - plan.cached_input_tokens - plan.cache_creation_input_tokens
    return {
        "input_tokens": uncached,
        "cache_creation_input_tokens": plan.cache_creation_input_tokens,
        "cache_read_input_tokens": plan.cached_input_tokens,
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: %b\ndata: %b\n\n" % (name.encode(), orjson.dumps(data))


def _model_info(name: str) -> dict[str, Any]:
    return {"type": "model", "id": name, "display_name": name, "created_at": "2025-01-01T00:00:00Z"}


def _tools(value: Any) -> tuple[ToolSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRequest("tools: Input should be a valid list")
    tools = []
    for index, tool in enumerate(value):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools.{index}.name: Field required")
        schema = tool.get("input_schema")
        if schema is None and tool.get("type") not in (None, "custom"):
            continue  # a server tool (web search, …): nothing for the simulated model to call
        if not isinstance(schema, dict):
            raise BadRequest(f"tools.{index}.custom.input_schema: Field required")
        description = str(tool.get("description") or "")
        tools.append(ToolSpec(name=tool["name"], parameters=schema, description=description))
    return tuple(tools)


def _thinking_budget(value: Any, max_tokens: int) -> int | None:
    """The thinking budget ``thinking`` asks for; None when thinking is off."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return None
    if kind == "adaptive":  # the model decides how long to think, within the output cap
        return max_tokens - 1 if max_tokens > 1 else None
    if kind != "enabled":
        raise BadRequest(
            "thinking: Input tag does not match any of the expected tags: 'disabled', 'enabled'"
        )
    budget = value.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise BadRequest("thinking.enabled.budget_tokens: Field required")
    if budget < MIN_THINKING_BUDGET:
        raise BadRequest(
            "thinking.enabled.budget_tokens: Input should be greater than or equal to "
            f"{MIN_THINKING_BUDGET}"
        )
    if max_tokens <= budget:
        raise BadRequest(
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
            "documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
            "#max-tokens-and-context-window-size"
        )
    return budget


def _output_schema(data: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema of structured outputs: ``output_config.format`` (GA) or the beta's
    ``output_format``; None for a prose answer."""
    config = data.get("output_config")
    spec = config.get("format") if isinstance(config, dict) else None
    name = "output_config.format"
    if spec is None:
        spec, name = data.get("output_format"), "output_format"
    if spec is None:
        return None
    if not isinstance(spec, dict) or spec.get("type") != "json_schema":
        raise BadRequest(f"{name}.type: Input should be 'json_schema'")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise BadRequest(f"{name}.schema: Field required")
    return schema


def _has_tool_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content
    )


def _tool_choice(value: Any, tools: tuple[ToolSpec, ...]) -> str:
    if value is None:
        return "auto" if tools else "none"
    if not isinstance(value, dict) or value.get("type") not in ("auto", "any", "tool", "none"):
        raise BadRequest("tool_choice: Input tag does not match any of the expected tags")
    kind = value["type"]
    if kind == "any":
        return "required"
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str) or name not in {tool.name for tool in tools}:
            raise BadRequest(f"tool_choice: tool {name!r} not found in tools")
        return name
    return str(kind)
