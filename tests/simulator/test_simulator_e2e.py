"""The real simulator processes on free ports, spoken to with the official SDKs (max_retries=0)."""

import json
import socket
import textwrap
import time

import anthropic
import httpx
import openai
import pytest

from simulator.launcher import running_simulator
from simulator.model import count_text_tokens

pytestmark = pytest.mark.e2e

FAST = "{ttft_ms: {median: 1, p95: 2}, tokens_per_s: {median: 20000, p05: 10000}, output_tokens: {median: 30, p95: 60}}"
SLOW = "{ttft_ms: {median: 200, p95: 200}, tokens_per_s: {median: 50, p05: 50}}"
MARKET = textwrap.dedent(
    f"""
    providers:
      - name: oa
        port: 0
        protocol: openai
        limits: {{requests_per_minute: 100000, input_tokens_per_minute: 100000000, output_tokens_per_minute: 100000000, concurrency: 500}}
        models: {{fast: {FAST}, slow: {SLOW}, flaky: {FAST}}}
      - name: an
        port: 0
        protocol: anthropic
        limits: {{requests_per_minute: 100000, input_tokens_per_minute: 100000000, output_tokens_per_minute: 100000000}}
        models: {{fast: {FAST}, slow: {SLOW}}}
      - name: tiny-oa
        port: 0
        protocol: openai
        limits: {{requests_per_minute: 2, input_tokens_per_minute: 100000, output_tokens_per_minute: 100000}}
        models: {{fast: {FAST}}}
      - name: tiny-an
        port: 0
        protocol: anthropic
        limits: {{requests_per_minute: 1, input_tokens_per_minute: 100000, output_tokens_per_minute: 100000}}
        models: {{fast: {FAST}}}
      - name: daily-oa
        port: 0
        protocol: openai
        limits: {{requests_per_day: 1}}
        models: {{fast: {FAST}}}
      - name: daily-an
        port: 0
        protocol: anthropic
        limits: {{requests_per_day: 1}}
        models: {{fast: {FAST}}}
    """
)
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
HELLO = [{"role": "user", "content": "Hello there, how are you today?"}]


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    market = tmp_path_factory.mktemp("market") / "market.yaml"
    market.write_text(MARKET)
    with running_simulator(market, latency_scale=1.0, seed=5) as ports:
        yield ports


def url(ports, provider: str) -> str:
    return f"http://127.0.0.1:{ports[provider]}"


def oa(ports, provider="oa") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url(ports, provider)}/v1", api_key="sk-test", max_retries=0)


def an(ports, provider="an") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url(ports, provider), api_key="sk-ant-test", max_retries=0)


def stats(ports, provider: str) -> dict:
    return httpx.get(f"{url(ports, provider)}/_stats").json()


def test_it_answers_openai_chat_completions(ports):
    completion = oa(ports).chat.completions.create(model="fast", messages=HELLO, max_tokens=500)

    choice = completion.choices[0]
    assert completion.object == "chat.completion" and completion.model == "fast"
    assert choice.finish_reason == "stop" and choice.message.role == "assistant"
    assert count_text_tokens(choice.message.content) == completion.usage.completion_tokens
    assert completion.usage.prompt_tokens > 0
    assert (
        completion.usage.total_tokens
        == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    assert completion.usage.prompt_tokens_details.cached_tokens == 0


def test_it_streams_openai_chunks_with_a_final_usage_chunk(ports):
    stream = oa(ports).chat.completions.create(
        model="fast",
        messages=HELLO,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert count_text_tokens(text) == 12


def test_it_calls_an_openai_tool_with_json_arguments(ports):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]

    completion = oa(ports).chat.completions.create(
        model="fast", messages=HELLO, max_tokens=500, tools=tools, tool_choice="required"
    )

    choice = completion.choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments["city"], str) and 1 <= arguments["days"] <= 7


def test_it_lists_models_in_both_protocols(ports):
    assert [m.id for m in oa(ports).models.list()] == ["fast", "slow", "flaky"]
    assert [m.id for m in an(ports).models.list()] == ["fast", "slow"]


def test_it_answers_anthropic_messages(ports):
    message = an(ports).messages.create(model="fast", max_tokens=500, messages=HELLO)

    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason == "end_turn"
    assert count_text_tokens(message.content[0].text) == message.usage.output_tokens
    assert message.usage.input_tokens > 0 and message.usage.cache_read_input_tokens == 0


def test_it_streams_anthropic_events_into_a_final_message(ports):
    with an(ports).messages.stream(model="fast", max_tokens=9, messages=HELLO) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()

    assert events[0] == "message_start" and "content_block_start" in events
    assert events[-1] == "message_stop" and "message_delta" in events
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 9
    assert count_text_tokens(final.content[0].text) == 9


def test_it_streams_an_anthropic_tool_use_as_partial_json(ports):
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]

    with an(ports).messages.stream(
        model="fast", max_tokens=500, messages=HELLO, tools=tools, tool_choice={"type": "any"}
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()

    (block,) = final.content
    assert set(deltas) == {"input_json_delta"} and final.stop_reason == "tool_use"
    assert (
        block.type == "tool_use" and block.id.startswith("toolu_") and block.name == "get_weather"
    )
    assert isinstance(block.input["city"], str) and 1 <= block.input["days"] <= 7


def test_it_answers_openai_429_with_retry_after_and_rate_limit_headers(ports):
    client = oa(ports, "tiny-oa")
    for _ in range(2):
        client.chat.completions.create(model="fast", messages=HELLO, max_tokens=5)

    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="fast", messages=HELLO, max_tokens=5)

    headers = caught.value.response.headers
    assert caught.value.status_code == 429 and caught.value.code == "rate_limit_exceeded"
    assert 25 <= int(headers["retry-after"]) <= 30  # one request refills every 30 s
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert headers["x-ratelimit-limit-tokens"] == "200000"
    assert stats(ports, "tiny-oa")["rate_limited"] == {"requests_per_minute": 1}


def test_it_answers_anthropic_429_with_retry_after_and_rate_limit_headers(ports):
    client = an(ports, "tiny-an")
    client.messages.create(model="fast", max_tokens=5, messages=HELLO)

    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model="fast", max_tokens=5, messages=HELLO)

    headers = caught.value.response.headers
    assert caught.value.body["error"]["type"] == "rate_limit_error"
    assert 55 <= int(headers["retry-after"]) <= 60
    assert headers["anthropic-ratelimit-requests-limit"] == "1"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    assert headers["anthropic-ratelimit-input-tokens-limit"] == "100000"
    assert headers["anthropic-ratelimit-tokens-limit"] == "200000"
    assert headers["request-id"] == caught.value.body["request_id"]


def test_it_refuses_an_exhausted_daily_limit_as_not_retryable(ports):
    client, messages = oa(ports, "daily-oa"), an(ports, "daily-an")
    client.chat.completions.create(model="fast", messages=HELLO, max_tokens=5)
    messages.messages.create(model="fast", max_tokens=5, messages=HELLO)

    with pytest.raises(openai.RateLimitError) as openai_refusal:
        client.chat.completions.create(model="fast", messages=HELLO, max_tokens=5)
    with pytest.raises(anthropic.RateLimitError) as anthropic_refusal:
        messages.messages.create(model="fast", max_tokens=5, messages=HELLO)

    assert openai_refusal.value.code == "insufficient_quota"
    assert (
        anthropic_refusal.value.body["error"]["details"]["error_code"]
        == "daily_request_limit_reached"
    )
    for refusal in (openai_refusal.value, anthropic_refusal.value):
        assert "retry-after" not in refusal.response.headers
        assert refusal.response.headers["x-should-retry"] == "false"


def test_it_refuses_requests_without_an_api_key_in_each_protocols_envelope(ports):
    openai_answer = httpx.post(f"{url(ports, 'oa')}/v1/chat/completions", json={"model": "fast"})
    anthropic_answer = httpx.post(f"{url(ports, 'an')}/v1/messages", json={"model": "fast"})

    assert (
        openai_answer.status_code == 401
        and openai_answer.json()["error"]["type"] == "invalid_request_error"
    )
    assert anthropic_answer.status_code == 401
    assert anthropic_answer.json()["type"] == "error"
    assert anthropic_answer.json()["error"]["type"] == "authentication_error"


def test_it_requires_max_tokens_and_the_version_header_on_anthropic(ports):
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    body = {"model": "fast", "messages": HELLO}

    missing_max = httpx.post(f"{url(ports, 'an')}/v1/messages", json=body, headers=headers)
    missing_version = httpx.post(
        f"{url(ports, 'an')}/v1/messages",
        json={**body, "max_tokens": 5},
        headers={"x-api-key": "k"},
    )

    assert missing_max.status_code == 400
    assert missing_max.json()["error"] == {
        "type": "invalid_request_error",
        "message": "max_tokens: Field required",
    }
    assert missing_version.status_code == 400


def test_it_paces_a_stream_after_the_time_to_first_token(ports):
    started = time.monotonic()
    arrivals = []
    stream = oa(ports).chat.completions.create(
        model="slow", messages=HELLO, max_tokens=20, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic() - started)

    assert arrivals[0] >= 0.18  # TTFT is exactly 200 ms in this market
    assert arrivals[-1] >= 0.18 + 19 / 50 * 0.9  # then 50 tokens/s
    assert len({round(t, 2) for t in arrivals}) >= 4  # spread over time, not one burst


def test_it_stops_generating_and_frees_the_slot_when_the_client_disconnects(ports):
    httpx.post(f"{url(ports, 'an')}/_reset")
    client = an(ports)
    with client.messages.stream(model="slow", max_tokens=3000, messages=HELLO) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                break
        assert stats(ports, "an")["concurrency"] == 1

    deadline = time.monotonic() + 5
    while stats(ports, "an")["concurrency"] and time.monotonic() < deadline:
        time.sleep(0.02)
    after = stats(ports, "an")
    assert after["concurrency"] == 0 and after["disconnects"] == 1
    assert after["responses"] == {"499": 1}
    assert 0 < after["output_tokens"] < 100


def test_it_counts_requests_and_tokens_in_stats_until_reset(ports):
    base = url(ports, "oa")
    assert httpx.post(f"{base}/_reset").status_code == 200
    client = oa(ports)
    answers = [
        client.chat.completions.create(model="fast", messages=HELLO, max_tokens=500)
        for _ in range(3)
    ]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HELLO, max_tokens=5)

    counted = stats(ports, "oa")

    assert counted["requests"] == 4 and counted["responses"] == {"200": 3, "404": 1}
    assert counted["input_tokens"] == sum(a.usage.prompt_tokens for a in answers)
    assert counted["output_tokens"] == sum(a.usage.completion_tokens for a in answers)
    assert counted["concurrency"] == 0 and counted["peak_concurrency"] == 1
    assert counted["limits"]["requests"]["limit"] == 100000


def test_it_starts_an_incident_on_request(ports):
    base = url(ports, "oa")
    bad = httpx.post(f"{base}/_incident", json={"model": "flaky", "for": "soon", "error_rate": 1.0})
    started = httpx.post(
        f"{base}/_incident", json={"model": "flaky", "for": "30s", "error_rate": 1.0}
    )

    with pytest.raises(openai.InternalServerError) as caught:
        oa(ports).chat.completions.create(model="flaky", messages=HELLO, max_tokens=5)

    assert bad.status_code == 400 and "incident.for" in bad.json()["error"]
    assert started.status_code == 200 and started.json()["overrides"] == {"error_rate": 1.0}
    assert caught.value.status_code == 500 and caught.value.body["type"] == "server_error"
    assert stats(ports, "oa")["incidents"][0]["model"] == "flaky"
    oa(ports).chat.completions.create(model="fast", messages=HELLO, max_tokens=5)  # others fine


def test_it_frees_the_slot_when_a_client_gives_up_on_a_non_streaming_answer(ports):
    httpx.post(f"{url(ports, 'oa')}/_reset")
    body = {"model": "slow", "messages": HELLO, "max_tokens": 500}
    headers = {"Authorization": "Bearer k"}

    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{url(ports, 'oa')}/v1/chat/completions", json=body, headers=headers, timeout=0.05
        )

    deadline = time.monotonic() + 5
    while stats(ports, "oa")["concurrency"] and time.monotonic() < deadline:
        time.sleep(0.02)
    after = stats(ports, "oa")
    assert after["concurrency"] == 0 and after["disconnects"] == 1
    assert after["output_tokens"] == 0  # gone before the first token


def test_it_answers_curl_style_expect_continue_and_pipelined_requests(ports):
    body = json.dumps({"model": "fast", "messages": HELLO, "max_tokens": 3}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", ports["oa"]), timeout=5) as sock:
        sock.sendall(head + b"Expect: 100-continue\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body + head + b"\r\n" + body)  # the second request pipelined behind the first
        received = b""
        while received.count(b"HTTP/1.1 200 OK") < 2:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            received += chunk


def test_it_streams_an_openai_tool_call_in_argument_fragments(ports):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    stream = oa(ports).chat.completions.create(
        model="fast",
        messages=HELLO,
        max_tokens=500,
        tools=tools,
        tool_choice="required",
        stream=True,
    )

    calls = [
        c.choices[0].delta.tool_calls for c in stream if c.choices and c.choices[0].delta.tool_calls
    ]

    assert calls[0][0].id.startswith("call_") and calls[0][0].function.name == "get_weather"
    assert len(calls) > 2  # the arguments arrive in pieces
    arguments = json.loads("".join(call[0].function.arguments or "" for call in calls))
    assert isinstance(arguments["city"], str) and 1 <= arguments["days"] <= 7


def test_it_counts_calls_by_the_caller_each_request_names(ports):
    base = url(ports, "oa")
    httpx.post(f"{base}/_reset")
    for user in ("req-1", "req-2", "req-2"):
        oa(ports).chat.completions.create(model="fast", messages=HELLO, max_tokens=5, user=user)
    oa(ports).chat.completions.create(model="fast", messages=HELLO, max_tokens=5)  # no caller
    an(ports).messages.create(
        model="fast", messages=HELLO, max_tokens=5, metadata={"user_id": "req-3"}
    )

    assert httpx.get(f"{base}/_calls").json() == {"by_caller": {"req-1": 1, "req-2": 2}}
    assert httpx.get(f"{url(ports, 'an')}/_calls").json()["by_caller"]["req-3"] == 1
    httpx.post(f"{base}/_reset")
    assert httpx.get(f"{base}/_calls").json() == {"by_caller": {}}


def test_it_answers_a_repeated_idempotency_key_from_the_first_call(ports):
    """E5: a gateway re-sends a dead run's request with the same key; the provider serves it
    once and answers the repeat with the first answer (GET /_idempotency counts both)."""
    key = f"job-{time.time_ns()}"
    body = {"model": "slow", "messages": HELLO, "max_tokens": 5}
    headers = {"Authorization": "Bearer k", "Idempotency-Key": key}
    with httpx.Client(base_url=url(ports, "oa"), timeout=10) as client:
        # The first call's client hangs up before the answer (a worker SIGKILLed mid-call)…
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/chat/completions", json=body, headers=headers, timeout=0.05)
        # …its repeat waits for that call's answer instead of being served again.
        repeat = client.post("/v1/chat/completions", json=body, headers=headers)
        again = client.post("/v1/chat/completions", json=body, headers=headers)
        other = client.post(
            "/v1/chat/completions", json=body, headers={**headers, "Idempotency-Key": key + "x"}
        )
        keys = client.get("/_idempotency").json()

    assert repeat.status_code == again.status_code == 200
    assert repeat.headers["idempotent-replayed"] == "true"
    assert repeat.json() == again.json()
    assert "idempotent-replayed" not in other.headers and other.json()["id"] != repeat.json()["id"]
    assert keys["executions"][key] == 1 and keys["executions"][key + "x"] == 1
    assert keys["replays"] >= 2
