"""The adapters' embed operation: OpenAI's ``/embeddings`` wire; Anthropic has none."""

from __future__ import annotations

import pytest
from openai.types import CreateEmbeddingResponse

from gateway.providers.anthropic import AnthropicAdapter
from gateway.providers.base import RequestNotSupported, StreamError, Usage
from gateway.providers.openai import OpenAIAdapter

ADAPTER = OpenAIAdapter()
BODY = {
    "model": "acme/embed-small",
    "input": ["one", "two"],
    "dimensions": 256,
    "encoding_format": "base64",
    "user": "u-1",
    "provider": {"order": ["alpha"]},
}
ANSWER = {
    "object": "list",
    "data": [
        {"object": "embedding", "index": 0, "embedding": [0.6, 0.8]},
        {"object": "embedding", "index": 1, "embedding": "AACAPwAAAAA="},
    ],
    "model": "embed-small-v2",
    "usage": {"prompt_tokens": 7, "total_tokens": 7},
}


def test_the_request_goes_to_embeddings_with_the_upstream_model_and_no_gateway_fields():
    wire = ADAPTER.build_embeddings_request(BODY, upstream_model="embed-small", api_key="sk-up")
    assert wire.path == "/embeddings"
    assert wire.headers["Authorization"] == "Bearer sk-up"
    assert wire.json == {
        "model": "embed-small",
        "input": ["one", "two"],
        "dimensions": 256,
        "encoding_format": "base64",
        "user": "u-1",
    }


def test_the_answer_is_renamed_and_its_usage_is_input_only():
    completion = ADAPTER.parse_embeddings(ANSWER, model="acme/embed-small")
    assert completion.usage == Usage(input_tokens=7, output_tokens=0)
    assert completion.body["model"] == "acme/embed-small"
    assert completion.body["data"] == ANSWER["data"]
    # What the openai SDK parses embeddings.create into (floats: base64 it hands back as is).
    floats = {**completion.body, "data": completion.body["data"][:1]}
    parsed = CreateEmbeddingResponse.model_validate(floats)
    assert parsed.usage.prompt_tokens == parsed.usage.total_tokens == 7


def test_an_answer_without_usage_keeps_the_estimate():
    answer = {key: value for key, value in ANSWER.items() if key != "usage"}
    completion = ADAPTER.parse_embeddings(answer, model="m")
    assert completion.usage is None and "usage" not in completion.body


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"object": "list"},
        {"data": [{"index": 0}]},
        {"data": [{"embedding": 3}]},
        {"error": {"message": "overloaded", "type": "server_error"}},
    ],
)
def test_a_malformed_or_error_body_is_a_stream_error(data):
    with pytest.raises(StreamError):
        ADAPTER.parse_embeddings(data, model="m")


def test_anthropic_cannot_embed():
    with pytest.raises(RequestNotSupported):
        AnthropicAdapter().build_embeddings_request(BODY, upstream_model="x", api_key="k")
