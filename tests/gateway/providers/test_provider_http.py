"""Adapters driven through a real httpx.AsyncClient over an injected MockTransport.

This is the pipeline's shape in miniature: build the request, POST it, parse SSE as it
arrives, translate, and serve ``data: {chunk}`` lines that the official openai client reads.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai

from gateway.providers import adapter_for
from gateway.providers.base import JSON, LimitObservation, Outcome, SSEParser

NOW = 1_750_000_000.0  # 2025-06-15T15:06:40Z
ANTHROPIC_HEADERS = {
    "content-type": "text/event-stream; charset=utf-8",
    "request-id": "req_018EeWyXxfu5pfWkrYcMdjWG",
    "anthropic-ratelimit-requests-limit": "1000",
    "anthropic-ratelimit-requests-remaining": "999",
    "anthropic-ratelimit-requests-reset": "2025-06-15T15:06:41Z",
    "anthropic-ratelimit-input-tokens-limit": "80000",
    "anthropic-ratelimit-input-tokens-remaining": "78000",
    "anthropic-ratelimit-input-tokens-reset": "2025-06-15T15:06:42.5Z",
    "anthropic-ratelimit-output-tokens-limit": "16000",
    "anthropic-ratelimit-output-tokens-remaining": "16000",
    "anthropic-ratelimit-output-tokens-reset": "2025-06-15T15:06:40Z",
    "anthropic-ratelimit-tokens-limit": "96000",
    "anthropic-ratelimit-tokens-remaining": "94000",
    "anthropic-ratelimit-tokens-reset": "not a time",
}


async def dribble(raw: bytes, size: int) -> AsyncIterator[bytes]:
    """The recording in uneven pieces, splitting lines and multi-byte characters."""
    for start in range(0, len(raw), size):
        yield raw[start : start + size]
        await asyncio.sleep(0)


async def through_gateway(raw: bytes, body: JSON) -> tuple[JSON, list[JSON], Any, Any]:
    """(sent request, chunks, translator, rate limits) for one streamed Anthropic answer."""
    adapter = adapter_for("anthropic")
    sent: JSON = {}

    def provider(request: httpx.Request) -> httpx.Response:
        sent.update(url=str(request.url), headers=dict(request.headers))
        sent["json"] = json.loads(request.content)
        return httpx.Response(200, headers=ANTHROPIC_HEADERS, content=dribble(raw, 7))

    upstream = adapter.build_request(
        body, upstream_model="chat-large-fast", api_key="sk-ant-1", stream=True, max_output=8192
    )
    translator = adapter.stream_translator(
        response_id="gen-abc", model="acme/chat-large", created=7
    )
    parser, chunks = SSEParser(), []
    async with (
        httpx.AsyncClient(transport=httpx.MockTransport(provider)) as client,
        client.stream(
            "POST",
            "http://127.0.0.1:9102" + upstream.path,
            json=upstream.json,
            headers=upstream.headers,
        ) as response,
    ):
        limits = adapter.rate_limits(response.headers, now=NOW)
        async for piece in response.aiter_bytes():
            for event in parser.feed(piece):
                chunks.extend(translator.feed(event))
    return sent, chunks, translator, limits


async def client_view(chunks: list[JSON]) -> list[Any]:
    """What the official openai SDK yields when the gateway serves these chunks."""
    served = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"

    def gateway(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=served)

    transport = httpx.MockTransport(gateway)
    async with httpx.AsyncClient(transport=transport) as http:
        client = openai.AsyncOpenAI(
            base_url="http://gateway.test/v1", api_key="sk-sy-x", http_client=http, max_retries=0
        )
        stream = await client.chat.completions.create(
            model="acme/chat-large", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return [chunk async for chunk in stream]


def test_it_streams_an_anthropic_answer_to_an_openai_client(
    recorded: Callable[[str], bytes],
) -> None:
    body = {
        "model": "acme/chat-large",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "stream": True,
    }
    sent, chunks, translator, limits = asyncio.run(
        through_gateway(recorded("anthropic_text.sse"), body)
    )
    assert sent["url"] == "http://127.0.0.1:9102/v1/messages"
    assert sent["headers"]["x-api-key"] == "sk-ant-1"
    assert sent["headers"]["anthropic-version"] == "2023-06-01"
    assert sent["json"] == {
        "model": "chat-large-fast",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_tokens": 8192,
        "stream": True,
    }

    seen = asyncio.run(client_view(chunks))
    assert "".join(c.choices[0].delta.content or "" for c in seen if c.choices) == (
        "Hello, Zoë — ça va?"
    )
    assert [c.choices[0].finish_reason for c in seen if c.choices][-1] == "stop"
    assert {c.id for c in seen} == {"gen-abc"} and {c.model for c in seen} == {"acme/chat-large"}
    assert seen[-1].choices == [] and seen[-1].usage is not None
    assert seen[-1].usage.prompt_tokens == 2125
    assert seen[-1].usage.prompt_tokens_details.cached_tokens == 2000  # type: ignore[union-attr]

    assert translator.done and translator.usage.output_tokens == 15
    assert limits.retry_after is None
    assert limits.observations == (
        LimitObservation("requests", 1000.0, 999.0, 1.0),
        LimitObservation("tokens", 96000.0, 94000.0, None),  # garbled reset skipped
        LimitObservation("input_tokens", 80000.0, 78000.0, 2.5),
        LimitObservation("output_tokens", 16000.0, 16000.0, 0.0),
    )


def test_it_streams_tool_calls_to_an_openai_client(recorded: Callable[[str], bytes]) -> None:
    body = {"messages": [{"role": "user", "content": "Weather?"}], "tools": []}
    _, chunks, translator, _ = asyncio.run(through_gateway(recorded("anthropic_tools.sse"), body))
    seen = asyncio.run(client_view(chunks))
    calls: dict[int, dict[str, str]] = {}
    for chunk in seen:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += call.id or ""
            entry["name"] += (call.function.name or "") if call.function else ""
            entry["arguments"] += (call.function.arguments or "") if call.function else ""
    assert {i: (c["name"], json.loads(c["arguments"])) for i, c in calls.items()} == {
        0: ("get_weather", {"location": "San Francisco, CA", "unit": "celsius"}),
        1: ("get_weather", {"location": "Paris"}),
    }
    assert translator.finish_reason == "tool_calls"


def test_it_classifies_a_throttled_answer_from_real_headers() -> None:
    adapter = adapter_for("openai")

    def provider(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            429,
            headers={
                "Retry-After-Ms": "1500",
                "Retry-After": "2",
                "X-RateLimit-Remaining-Requests": "0",
                "X-RateLimit-Reset-Requests": "1.5s",
            },
            json={"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}},
        )

    async def call() -> httpx.Response:
        upstream = adapter.build_request(
            {"messages": []}, upstream_model="chat-large", api_key="k", stream=False, max_output=1
        )
        async with httpx.AsyncClient(transport=httpx.MockTransport(provider)) as client:
            return await client.post(
                "http://127.0.0.1:9101/v1" + upstream.path,
                json=upstream.json,
                headers=upstream.headers,
            )

    response = asyncio.run(call())
    assert adapter.classify(response.status_code, response.headers, response.content).outcome is (
        Outcome.CAPACITY
    )
    limits = adapter.rate_limits(response.headers, now=NOW)
    assert limits.retry_after == 1.5
    assert limits.observations == (LimitObservation("requests", None, 0.0, 1.5),)
