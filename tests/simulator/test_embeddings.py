"""The simulator's ``/v1/embeddings`` (OpenAI wire), spoken to with the official ``openai`` SDK."""

import base64
import math
import struct
import textwrap

import httpx
import openai
import pytest

from simulator.launcher import running_simulator
from simulator.model import count_text_tokens
from simulator.server.embeddings import embedding_vector

pytestmark = pytest.mark.e2e

EMBED = "{ttft_ms: {median: 5, p95: 10}, tokens_per_s: {median: 100, p05: 50}, embedding_dimensions: 64}"
CHAT = "{ttft_ms: {median: 1, p95: 2}, tokens_per_s: {median: 20000, p05: 10000}}"
MARKET = textwrap.dedent(
    f"""
    providers:
      - name: oa
        port: 0
        protocol: openai
        limits: {{requests_per_minute: 100000, input_tokens_per_minute: 100000, output_tokens_per_minute: 10}}
        models: {{embed: {EMBED}, chat: {CHAT}}}
      - name: tiny
        port: 0
        protocol: openai
        limits: {{requests_per_minute: 1}}
        models: {{embed: {EMBED}}}
      - name: an
        port: 0
        protocol: anthropic
        models: {{embed: {EMBED}}}
    """
)


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    market = tmp_path_factory.mktemp("market") / "market.yaml"
    market.write_text(MARKET)
    with running_simulator(market, latency_scale=1.0, seed=3) as ports:
        yield ports


def client(ports, provider="oa") -> openai.OpenAI:
    base = f"http://127.0.0.1:{ports[provider]}/v1"
    return openai.OpenAI(base_url=base, api_key="sk-test", max_retries=0)


def norm(vector) -> float:
    return math.sqrt(sum(x * x for x in vector))


def test_one_string_embeds_to_a_unit_vector_of_the_models_dimension_with_its_usage(ports):
    text = "The quick brown fox jumps over the lazy dog."
    answer = client(ports).embeddings.create(model="embed", input=text)
    assert answer.object == "list" and answer.model == "embed"
    [item] = answer.data
    assert item.index == 0 and len(item.embedding) == 64
    assert norm(item.embedding) == pytest.approx(1.0)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == count_text_tokens(text)


def test_vectors_are_a_function_of_the_input_only(ports):
    first = client(ports).embeddings.create(model="embed", input=["alpha", "beta", "alpha"])
    again = client(ports).embeddings.create(model="embed", input="beta")
    vectors = [item.embedding for item in first.data]
    assert [item.index for item in first.data] == [0, 1, 2]
    assert vectors[0] == vectors[2] != vectors[1]
    assert again.data[0].embedding == vectors[1]
    assert vectors[1] == pytest.approx(embedding_vector("beta", 64))


def test_a_batch_counts_every_input_and_token_arrays_by_their_length(ports):
    texts = ["one short line", "and another, longer, line of text"]
    batch = client(ports).embeddings.create(model="embed", input=texts)
    assert batch.usage.prompt_tokens == sum(count_text_tokens(t) for t in texts)
    tokens = client(ports).embeddings.create(model="embed", input=[[1, 2, 3], [4, 5]])
    assert tokens.usage.prompt_tokens == 5 and len(tokens.data) == 2
    single = client(ports).embeddings.create(model="embed", input=[7, 8, 9, 10])
    assert single.usage.prompt_tokens == 4 and len(single.data) == 1


def test_dimensions_shortens_and_renormalises_and_base64_carries_the_same_floats(ports):
    short = client(ports).embeddings.create(model="embed", input="hello", dimensions=16)
    assert len(short.data[0].embedding) == 16
    assert norm(short.data[0].embedding) == pytest.approx(1.0)
    # Asked for explicitly, base64 comes back to the caller as it is: little-endian float32.
    encoded = client(ports).embeddings.create(
        model="embed", input="hello", dimensions=16, encoding_format="base64"
    )
    floats = struct.unpack("<16f", base64.b64decode(encoded.data[0].embedding))
    assert floats == pytest.approx(short.data[0].embedding, abs=1e-6)


def test_embeddings_reserve_no_output_tokens(ports):
    # The provider's output bucket holds 10 tokens: a chat answer would be refused, vectors not.
    for _ in range(3):
        client(ports).embeddings.create(model="embed", input="no output is produced")
    with pytest.raises(openai.RateLimitError):
        client(ports).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}]
        )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "embed"}, "input"),
        ({"model": "embed", "input": ""}, "input"),
        ({"model": "embed", "input": []}, "input"),
        ({"model": "embed", "input": ["a", 1]}, "input"),
        ({"model": "embed", "input": [[1], []]}, "input"),
        ({"model": "embed", "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "embed", "input": "x", "dimensions": 65}, "dimensions"),
        ({"model": "embed", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "chat", "input": "x"}, "model"),
    ],
)
def test_bad_requests_are_400_naming_the_parameter(ports, body, param):
    answer = httpx.post(
        f"http://127.0.0.1:{ports['oa']}/v1/embeddings",
        headers={"Authorization": "Bearer sk-test"},
        json=body,
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


def test_an_unknown_model_is_404(ports):
    with pytest.raises(openai.NotFoundError):
        client(ports).embeddings.create(model="nope", input="x")


def test_over_the_request_rate_it_answers_429_with_retry_after(ports):
    client(ports, "tiny").embeddings.create(model="embed", input="first")
    with pytest.raises(openai.RateLimitError) as caught:
        client(ports, "tiny").embeddings.create(model="embed", input="second")
    assert int(caught.value.response.headers["retry-after"]) >= 1
    assert caught.value.code == "rate_limit_exceeded"


def test_the_anthropic_wire_has_no_embeddings(ports):
    answer = httpx.post(f"http://127.0.0.1:{ports['an']}/v1/embeddings", json={})
    assert answer.status_code == 404
