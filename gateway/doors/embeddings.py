"""``POST /v1/embeddings``: OpenAI's embeddings API as a door (issue 16 item 4).

The body stays in OpenAI's embeddings form (``operation == "embed"``): the adapters' embed
operation sends it, and only endpoints whose ``supports`` lists ``embeddings`` are planned. It
is estimated as input tokens alone — a token array counts exactly, a string by the heuristic,
summed over the batch — and reserves no output (``max_output=0``), so it is routed without the
output terms of the routing cost and a provider's embedding token limit is a bucket like any
other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpResponse

from gateway.doors.base import JSON, CanonicalRequest, Rendering, StreamRenderer
from gateway.doors.chat import preferences_parse
from gateway.errors import GatewayError, InvalidRequest, error_response
from gateway.providers.base import Completion, Usage
from gateway.validation import MAX_PROVIDER_BYTES, json_object_parse
from quotas.core.estimate import RequestEstimate, text_tokens

EMBEDDINGS = "embeddings"  # the capability (``supports``) and the door's name
MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request
MAX_TOKEN_ID = 2**31 - 1
ENCODINGS = ("float", "base64")
# Corrections of the estimate are learned per class: text is estimated, token arrays are exact
# and must not inherit the text's factor.
TEXT_FAMILY, TOKENS_FAMILY = "embeddings:text", "embeddings:tokens"
INPUT_SHAPES = (
    "a string, an array of strings, an array of token ids (integers) or an array of arrays of "
    "token ids"
)


class EmbeddingsDoor:
    name = EMBEDDINGS
    protocol = "openai"

    def parse(self, raw: bytes, headers: Mapping[str, str]) -> CanonicalRequest:
        body = json_object_parse(raw, max_bytes=settings.MAX_REQUEST_BODY_BYTES)
        model = _model(body.get("model"))
        inputs, exact = _inputs(body.get("input"))
        _check_options(body)
        return CanonicalRequest(
            door=self,
            body=body,
            model=model,
            models=_fallbacks(body.get("models")),
            estimate=RequestEstimate(
                input_tokens=sum(len(i) if isinstance(i, list) else text_tokens(i) for i in inputs),
                max_output=0,
                prompt_family=TOKENS_FAMILY if exact else TEXT_FAMILY,
                structured_output="none",
            ),
            user=body.get("user"),
            preferences=preferences_parse(body.get("provider")),
            features=frozenset({EMBEDDINGS}),
            operation="embed",
        )

    async def answer(
        self, request: CanonicalRequest, completion: Completion, usage: Usage, how: Rendering
    ) -> JSON:
        result = completion.body
        result["model"] = how.model
        result["provider"] = how.provider
        result["usage"] = {
            "prompt_tokens": usage.input_tokens,
            "total_tokens": usage.input_tokens,
            "cost": how.cost(usage),
        }
        return result

    def stream_renderer(self, request: CanonicalRequest, how: Rendering) -> StreamRenderer:
        raise AssertionError("embeddings never stream: parse refuses 'stream'")

    def error_response(self, error: GatewayError, headers: Mapping[str, str]) -> HttpResponse:
        return error_response(error, dict(headers))


def _invalid(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param, code="invalid_value")


def _model(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 200:
        raise _invalid("model", "must be a model id (a non-empty string of at most 200).")
    return value


def _inputs(value: Any) -> tuple[list[str] | list[list[int]], bool]:
    """The batch, and whether it is token ids (counted exactly) rather than text."""
    if value is None:
        raise _invalid("input", f"is required: {INPUT_SHAPES}.")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise _invalid("input", f"must be {INPUT_SHAPES}, and not empty.")
    if all(_is_token(item) for item in value):
        return [value], True
    if len(value) > MAX_INPUTS:
        raise _invalid("input", f"must hold at most {MAX_INPUTS} inputs, got {len(value)}.")
    texts = all(isinstance(item, str) for item in value)
    for index, item in enumerate(value):
        if texts and not item:
            raise _invalid(f"input[{index}]", "must not be empty.")
        if not texts and not (
            isinstance(item, list) and item and all(_is_token(token) for token in item)
        ):
            raise _invalid(
                f"input[{index}]",
                "must be a non-empty array of token ids (integers 0 to 2^31-1), as the other "
                "inputs are, or every input a string.",
            )
    return value, not texts


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def _check_options(body: JSON) -> None:
    dimensions = body.get("dimensions")
    if dimensions is not None and not (
        isinstance(dimensions, int) and not isinstance(dimensions, bool) and dimensions >= 1
    ):
        raise _invalid("dimensions", "must be an integer of at least 1.")
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in ENCODINGS:
        raise _invalid("encoding_format", "must be 'float' or 'base64'.")
    user = body.get("user")
    if user is not None and not (isinstance(user, str) and len(user) <= 256):
        raise _invalid("user", "must be a string of at most 256 characters.")
    provider = body.get("provider")
    if provider is not None and (
        not isinstance(provider, dict) or len(orjson.dumps(provider)) > MAX_PROVIDER_BYTES
    ):
        raise _invalid("provider", f"must be an object of at most {MAX_PROVIDER_BYTES} bytes.")
    if body.get("stream") not in (None, False):
        raise _invalid("stream", "embeddings are answered whole; leave 'stream' out.")


def _fallbacks(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not (
        isinstance(value, list) and len(value) <= 8 and all(isinstance(m, str) and m for m in value)
    ):
        raise _invalid("models", "must be a list of at most 8 model ids.")
    return tuple(value)


EMBEDDINGS_DOOR = EmbeddingsDoor()
