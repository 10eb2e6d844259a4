"""The OpenAI Chat Completions wire protocol: requests, answers, SSE chunks, errors, headers."""

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
from simulator.model.request import CompletionRequest
from simulator.server.common import (
    JSON_OBJECT_SCHEMA,
    BadRequest,
    Content,
    Headers,
    Parsed,
    Response,
    caller_of,
    count_images,
    go_duration,
    load_json_object,
    make_id,
    optional_int,
    requests_dimension,
    stop_list,
    text_of,
    tokens_dimension,
)

FINISH_REASONS = {"end": "stop", "max_tokens": "length", "tool_use": "tool_calls"}
FINISH_REASONS["stop_sequence"] = "stop"
ORGANIZATION = "org-simulator"
RATE_LIMITS_URL = "https://platform.openai.com/account/rate-limits"
_FAILURE_MESSAGES = {
    500: "The server had an error while processing your request. Sorry about that!",
    503: "That model is currently overloaded with other requests. You can retry your request.",
}


class OpenAIWire:
    protocol = "openai"
    completion_path = "/v1/chat/completions"
    tool_id_prefix = "call_"

    def __init__(self, spec: ProviderSpec, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng

    # -- requests ----------------------------------------------------------------------------

    def authenticate(self, headers: dict[str, str]) -> Response | None:
        scheme, _, key = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and key.strip():
            return None
        message = (
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
        return self.error(401, "invalid_request_error", message)

    def api_key(self, headers: dict[str, str]) -> str:
        """The key a request came with (after ``authenticate`` let it through)."""
        return headers.get("authorization", "").partition(" ")[2].strip()

    def key_refused(self, shown: str) -> Response:
        """401 for a key the organisation does not have (revoked or never issued)."""
        message = (
            f"Incorrect API key provided: {shown}. You can find your API key at "
            "https://platform.openai.com/account/api-keys."
        )
        return self.error(401, "invalid_request_error", message, code="invalid_api_key")

    def parse(self, headers: dict[str, str], body: bytes) -> Parsed:
        data = load_json_object(body)
        model = data.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("you must provide a model parameter", param="model")
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array", param="messages")
        max_tokens = optional_int(data, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = optional_int(data, "max_tokens")
        tools = _tools(data.get("tools"))
        texts = [_message_text(message) for message in messages]
        stream_options = data.get("stream_options")
        include_usage = isinstance(stream_options, dict) and bool(
            stream_options.get("include_usage")
        )
        request = CompletionRequest(
            model=model,
            input_tokens=count_prompt_tokens(texts, tools, images=count_images(messages)),
            max_tokens=max_tokens,
            tools=tools,
            tool_choice=_tool_choice(data.get("tool_choice"), tools),
            stop_sequences=stop_list(data.get("stop"), "stop"),
            follows_tool_result=isinstance(messages[-1], dict)
            and messages[-1].get("role") == "tool",
            response_schema=_response_schema(data.get("response_format")),
        )
        return Parsed(
            request,
            stream=bool(data.get("stream")),
            include_usage=include_usage,
            caller=caller_of(data.get("user")),
        )

    # -- answers -----------------------------------------------------------------------------

    def completion(self, plan: Plan, content: Content, now: float) -> bytes:
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        if plan.tool_call is not None:
            message["tool_calls"] = [
                {
                    "id": content.tool_call_id,
                    "type": "function",
                    "function": {"name": plan.tool_call.name, "arguments": content.text},
                }
            ]
        else:
            message["content"] = content.text
        return orjson.dumps(
            {
                "id": make_id(self.rng, "chatcmpl-", 29),
                "object": "chat.completion",
                "created": int(now),
                "model": plan.model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": FINISH_REASONS[plan.stop_reason],
                    }
                ],
                "usage": usage(plan, plan.output_tokens),
                "service_tier": "default",
                "system_fingerprint": "fp_simulator",
            }
        )

    def stream(self, plan: Plan, content: Content, parsed: Parsed, now: float) -> OpenAIStream:
        return OpenAIStream(
            plan, content, parsed.include_usage, make_id(self.rng, "chatcmpl-", 29), now
        )

    def models(self) -> bytes:
        data = [
            {"id": name, "object": "model", "created": 1_700_000_000, "owned_by": self.spec.name}
            for name in self.spec.models
        ]
        return orjson.dumps({"object": "list", "data": data})

    def model(self, name: str) -> Response:
        if name not in self.spec.models:
            return self.model_not_found(name)
        body = {"id": name, "object": "model", "created": 1_700_000_000, "owned_by": self.spec.name}
        return Response(200, [], orjson.dumps(body))

    # -- errors and headers ------------------------------------------------------------------

    def error(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Headers | None = None,
    ) -> Response:
        body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
        return Response(status, headers or [], orjson.dumps(body))

    def bad_request(self, error: BadRequest) -> Response:
        return self.error(error.status, "invalid_request_error", error.message, param=error.param)

    def model_not_found(self, model: str) -> Response:
        message = f"The model `{model}` does not exist or you do not have access to it."
        return self.error(404, "invalid_request_error", message, code="model_not_found")

    def not_found(self, path: str) -> Response:
        message = f"Invalid URL ({path})"
        return self.error(404, "invalid_request_error", message)

    def rejection(self, rejection: Rejection, model: str, now: float) -> Response:
        reason = rejection.reason
        if reason == "model_not_found":
            return self.model_not_found(model)
        if reason == "context_length_exceeded":
            message = (
                f"This model's maximum context length is {rejection.limit} tokens. However, your "
                f"messages resulted in {rejection.requested} tokens. Please reduce the length of "
                "the messages."
            )
            return self.error(400, "invalid_request_error", message, code=reason, param="messages")
        headers = self.limit_headers(rejection.limits, now)
        if reason == "requests_per_day":
            headers.append(("x-should-retry", "false"))
            message = (
                "You exceeded your current quota, please check your plan and billing details "
                f"(requests per day: limit {rejection.limit}). For more information on this "
                "error, read the docs: https://platform.openai.com/docs/guides/error-codes."
            )
            return self.error(
                429, "insufficient_quota", message, code="insufficient_quota", headers=headers
            )
        if reason == "request_too_large":
            headers.append(("x-should-retry", "false"))
            message = (
                f"Request too large for {model} in organization {ORGANIZATION} on tokens per min "
                f"(TPM): Limit {rejection.limit}, Requested {rejection.requested}. The input or "
                "output tokens must be reduced in order to run successfully. Visit "
                f"{RATE_LIMITS_URL} to learn more."
            )
            return self.error(429, "tokens", message, code="rate_limit_exceeded", headers=headers)
        retry_after = rejection.retry_after_header or 1
        headers.append(("retry-after", str(retry_after)))
        wait = go_duration(rejection.retry_after_s or 0.0)
        if reason == "concurrency":
            kind = "requests"
            what = f"concurrent requests: Limit {rejection.limit}"
        elif reason == "requests_per_minute":
            kind = "requests"
            what = f"requests per min (RPM): Limit {rejection.limit}, Requested 1"
        else:
            kind = "tokens"
            what = f"tokens per min (TPM): Limit {rejection.limit}, Requested {rejection.requested}"
        message = (
            f"Rate limit reached for {model} in organization {ORGANIZATION} on {what}. Please "
            f"try again in {wait}. Visit {RATE_LIMITS_URL} to learn more."
        )
        return self.error(429, kind, message, code="rate_limit_exceeded", headers=headers)

    def failure(self, status: int, headers: Headers) -> Response:
        return self.error(
            status, "server_error", _FAILURE_MESSAGES.get(status, "Error"), headers=headers
        )

    def failure_event(self, status: int) -> bytes:
        body = {
            "error": {
                "message": _FAILURE_MESSAGES.get(status, "Error"),
                "type": "server_error",
                "param": None,
                "code": None,
            }
        }
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def limit_headers(self, status: LimitStatus, now: float) -> Headers:
        headers: Headers = []
        requests = requests_dimension(status)
        if requests is not None:
            headers += [
                ("x-ratelimit-limit-requests", str(requests.limit)),
                ("x-ratelimit-remaining-requests", str(requests.remaining)),
                ("x-ratelimit-reset-requests", go_duration(requests.reset_s)),
            ]
        tokens = tokens_dimension(status)
        if tokens is not None:
            headers += [
                ("x-ratelimit-limit-tokens", str(tokens.limit)),
                ("x-ratelimit-remaining-tokens", str(tokens.remaining)),
                ("x-ratelimit-reset-tokens", go_duration(tokens.reset_s)),
            ]
        return headers

    def request_headers(self, processing_s: float, request_id: str | None = None) -> Headers:
        return [
            ("x-request-id", request_id or make_id(self.rng, "req_", 32)),
            ("openai-processing-ms", str(round(processing_s * 1000))),
            ("openai-version", "2020-10-01"),
            ("openai-organization", ORGANIZATION),
        ]


class OpenAIStream:
    """``chat.completion.chunk`` SSE events for one plan."""

    def __init__(
        self, plan: Plan, content: Content, include_usage: bool, chunk_id: str, now: float
    ) -> None:
        self.plan = plan
        self.content = content
        self.include_usage = include_usage
        self._prefix = (
            b'data: {"id":"%b","object":"chat.completion.chunk","created":%d,"model":%b,'
            b'"system_fingerprint":"fp_simulator","choices":['
            % (chunk_id.encode(), int(now), orjson.dumps(plan.model))
        )
        self._suffix = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self._prefix + orjson.dumps(choice) + self._suffix

    def head(self) -> bytes:
        if self.plan.tool_call is None:
            return self._chunk({"role": "assistant", "content": "", "refusal": None})
        return self._chunk({"role": "assistant", "content": None, "refusal": None})

    def first_token(self) -> bytes:
        call = self.plan.tool_call
        if call is None:
            return b""
        header = {
            "index": 0,
            "id": self.content.tool_call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        return self._chunk({"tool_calls": [header]})

    def tokens(self, start: int, end: int, group: int) -> bytes:
        """Events for tokens ``start..end``, ``group`` tokens per event."""
        out = []
        tool = self.plan.tool_call is not None
        for first in range(start, end, group):
            text = "".join(self.content.pieces[first : min(end, first + group)])
            if not text:
                continue
            if tool:
                out.append(
                    self._chunk({"tool_calls": [{"index": 0, "function": {"arguments": text}}]})
                )
            else:
                out.append(
                    self._prefix
                    + b'{"index":0,"delta":{"content":%b},"logprobs":null,"finish_reason":null}'
                    % orjson.dumps(text)
                    + self._suffix
                )
        return b"".join(out)

    def tail(self) -> bytes:
        plan = self.plan
        out = [self._chunk({}, FINISH_REASONS[plan.stop_reason])]
        if self.include_usage:
            out.append(
                self._prefix
                + b'],"usage":'
                + orjson.dumps(usage(plan, plan.output_tokens))
                + b"}\n\n"
            )
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)


def usage(plan: Plan, output_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": plan.input_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": plan.input_tokens + output_tokens,
        "prompt_tokens_details": {"cached_tokens": plan.cached_input_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _tools(value: Any) -> tuple[ToolSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRequest("Invalid 'tools': expected an array.", param="tools")
    tools = []
    for index, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(
                f"Missing required parameter: 'tools[{index}].function.name'.",
                param=f"tools[{index}].function",
            )
        parameters = function.get("parameters")
        tools.append(
            ToolSpec(
                name=function["name"],
                parameters=parameters if isinstance(parameters, dict) else {},
                description=str(function.get("description") or ""),
            )
        )
    return tuple(tools)


def _tool_choice(value: Any, tools: tuple[ToolSpec, ...]) -> str:
    if value is None:
        return "auto" if tools else "none"
    if value in ("auto", "none", "required"):
        return str(value)
    if isinstance(value, dict):
        function = value.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            name = function["name"]
            if name not in {tool.name for tool in tools}:
                raise BadRequest(
                    f"Invalid value for 'tool_choice': no function named '{name}' was specified "
                    "in the 'tools' parameter.",
                    param="tool_choice",
                )
            return str(name)
    raise BadRequest("Invalid value for 'tool_choice'.", param="tool_choice")


def _response_schema(value: Any) -> dict[str, Any] | None:
    """The schema ``response_format`` asks the answer to follow; None for prose (``text``)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise BadRequest(
                "Missing required parameter: 'response_format.json_schema.name'.",
                param="response_format.json_schema.name",
            )
        schema = spec.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise BadRequest(
                "Invalid type for 'response_format.json_schema.schema': expected an object.",
                param="response_format.json_schema.schema",
            )
        return schema if schema is not None else JSON_OBJECT_SCHEMA
    raise BadRequest(
        f"Invalid value: {kind!r}. Supported values are: 'text', 'json_object', and 'json_schema'.",
        param="response_format.type",
    )


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        raise BadRequest("Invalid 'messages': each message must be an object.", param="messages")
    parts = [text_of(message.get("content"))]
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            function = call["function"]
            parts.append(f"{function.get('name', '')} {function.get('arguments', '')}")
    return " ".join(parts)
