"""The simulator's provider batch APIs (E5): OpenAI's batches and Anthropic's message batches,
spoken to with the official SDKs over real HTTP; each line answered by the behaviour model,
outside the rate limits, counted in ``/_stats`` apart from live calls."""

import textwrap
import time

import anthropic
import httpx
import openai
import orjson
import pytest

from simulator.launcher import running_simulator
from simulator.model import MarketError
from simulator.model._reader import Node
from simulator.model.market import BatchSpec, parse_provider

pytestmark = pytest.mark.e2e

CHAT = "{ttft_ms: {median: 1, p95: 2}, tokens_per_s: {median: 20000, p05: 10000}, output_tokens: {median: 20, p95: 40}}"
MARKET = textwrap.dedent(
    f"""
    providers:
      - name: oa
        port: 0
        protocol: openai
        limits: {{requests_per_minute: 1}}
        batch: {{discount: 0.5, turnaround: 2s}}
        models: {{chat: {CHAT}}}
      - name: an
        port: 0
        protocol: anthropic
        limits: {{requests_per_minute: 1}}
        batch: {{discount: 0.5, turnaround: 2s}}
        models: {{chat: {CHAT}}}
      - name: plain
        port: 0
        protocol: openai
        models: {{chat: {CHAT}}}
    """
)


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    market = tmp_path_factory.mktemp("market") / "market.yaml"
    market.write_text(MARKET)
    with running_simulator(market, latency_scale=1.0, seed=5) as ports:
        yield ports


def stats(ports, name):
    return httpx.get(f"http://127.0.0.1:{ports[name]}/_stats").json()


def reset(ports, name):
    httpx.post(f"http://127.0.0.1:{ports[name]}/_reset")


def openai_client(ports, name="oa") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{ports[name]}/v1", api_key="sk-t", max_retries=0
    )


def jsonl(n, model="chat"):
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": f"q {i}"}]},
        }
        for i in range(n)
    ]
    return b"\n".join(orjson.dumps(line) for line in lines) + b"\n"


def test_the_market_parses_a_providers_batch_api_and_refuses_a_bad_one():
    base = {
        "name": "p",
        "port": 0,
        "protocol": "openai",
        "models": {
            "m": orjson.loads(
                b'{"ttft_ms": {"median": 1, "p95": 2}, "tokens_per_s": {"median": 10, "p05": 5}}'
            )
        },
    }
    spec = parse_provider(Node({**base, "batch": {"discount": 0.4, "turnaround": "1m"}}, "p"))
    assert spec.batch == BatchSpec(discount=0.4, turnaround=60.0)
    assert parse_provider(Node(base, "p")).batch is None
    with pytest.raises(MarketError, match=r"p\.batch\.discount"):
        parse_provider(Node({**base, "batch": {"discount": 1.5}}, "p"))


def test_an_openai_batch_answers_every_line_through_its_batch_queue_not_the_live_limits(ports):
    reset(ports, "oa")
    client = openai_client(ports)
    file = client.files.create(file=("in.jsonl", jsonl(5)), purpose="batch")
    assert file.purpose == "batch" and file.bytes == len(jsonl(5))
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "in_progress" and batch.request_counts.total == 5
    assert batch.request_counts.completed < 5  # the turnaround has not passed

    while (batch := client.batches.retrieve(batch.id)).status != "completed":
        time.sleep(0.2)

    assert batch.request_counts.completed == 5 and batch.request_counts.failed == 0
    records = [
        orjson.loads(x) for x in client.files.content(batch.output_file_id).content.splitlines()
    ]
    assert sorted(r["custom_id"] for r in records) == [f"line-{i}" for i in range(5)]
    for record in records:
        body = record["response"]["body"]
        assert record["response"]["status_code"] == 200 and record["error"] is None
        assert body["object"] == "chat.completion" and body["model"] == "chat"
        assert body["usage"]["completion_tokens"] > 0
    counted = stats(ports, "oa")
    # Five lines on a provider allowing one request a minute: none was a live request.
    assert counted["requests"] == 0
    assert counted["batch"]["lines"] == counted["batch"]["succeeded"] == 5
    assert counted["batch"]["custom_ids"] == 5 and counted["batch"]["custom_ids_repeated"] == 0
    assert counted["batch"]["output_tokens"] == sum(
        r["response"]["body"]["usage"]["completion_tokens"] for r in records
    )
    assert counted["batch_api"] == {"discount": 0.5, "turnaround_s": 2.0}


def test_an_unknown_model_is_a_failed_line_in_the_error_file(ports):
    client = openai_client(ports)
    file = client.files.create(file=("in.jsonl", jsonl(1, model="nope")), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    while (batch := client.batches.retrieve(batch.id)).status != "completed":
        time.sleep(0.2)
    assert batch.request_counts.failed == 1 and batch.output_file_id is None
    [record] = client.files.content(batch.error_file_id).content.splitlines()
    assert orjson.loads(record)["response"]["status_code"] == 404


def test_the_same_idempotency_key_makes_one_batch(ports):
    client = openai_client(ports)
    file = client.files.create(file=("in.jsonl", jsonl(2)), purpose="batch")
    made = [
        client.batches.create(
            input_file_id=file.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_headers={"Idempotency-Key": "one-batch"},
        )
        for _ in range(2)
    ]
    assert made[0].id == made[1].id


def test_a_cancelled_openai_batch_ends_cancelled_with_its_unrun_lines_never_run(ports):
    reset(ports, "oa")
    client = openai_client(ports)
    file = client.files.create(file=("in.jsonl", jsonl(50)), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "cancelled" and batch.request_counts.completed < 50
    time.sleep(2.2)  # past the turnaround: nothing more runs
    assert (
        client.batches.retrieve(batch.id).request_counts.completed == batch.request_counts.completed
    )
    counted = stats(ports, "oa")["batch"]
    assert counted["cancelled"] == 1
    assert batch.request_counts.completed + counted["lines_cancelled"] == 50


def test_a_batch_on_a_provider_without_a_batch_api_is_a_404(ports):
    with pytest.raises(openai.NotFoundError):
        openai_client(ports, "plain").files.create(file=("in.jsonl", jsonl(1)), purpose="batch")


def test_a_bad_upload_is_a_400(ports):
    with pytest.raises(openai.BadRequestError, match="purpose"):
        openai_client(ports).files.create(file=("in.jsonl", jsonl(1)), purpose="fine-tune")


def anthropic_client(ports) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=f"http://127.0.0.1:{ports['an']}", api_key="sk-t", max_retries=0
    )


def message_requests(n):
    return [
        {
            "custom_id": f"line-{i}",
            "params": {
                "model": "chat",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": f"q {i}"}],
            },
        }
        for i in range(n)
    ]


def test_an_anthropic_message_batch_ends_with_a_result_per_line(ports):
    reset(ports, "an")
    client = anthropic_client(ports)
    batch = client.messages.batches.create(requests=message_requests(4))
    assert batch.processing_status == "in_progress" and batch.type == "message_batch"

    while (batch := client.messages.batches.retrieve(batch.id)).processing_status != "ended":
        time.sleep(0.2)

    assert batch.request_counts.succeeded == 4 and batch.results_url
    results = list(client.messages.batches.results(batch.id))
    assert sorted(r.custom_id for r in results) == [f"line-{i}" for i in range(4)]
    for result in results:
        assert result.result.type == "succeeded"
        assert result.result.message.usage.output_tokens > 0
    counted = stats(ports, "an")
    assert counted["requests"] == 0 and counted["batch"]["succeeded"] == 4
    assert counted["batch"]["custom_ids_repeated"] == 0


def test_a_cancelled_anthropic_batch_reports_its_unrun_lines_canceled(ports):
    client = anthropic_client(ports)
    batch = client.messages.batches.create(requests=message_requests(40))
    client.messages.batches.cancel(batch.id)
    batch = client.messages.batches.retrieve(batch.id)
    assert batch.processing_status == "ended" and batch.cancel_initiated_at is not None
    results = list(client.messages.batches.results(batch.id))
    canceled = [r for r in results if r.result.type == "canceled"]
    assert len(results) == 40 and batch.request_counts.canceled == len(canceled) > 0


def test_an_anthropic_batch_with_a_repeated_custom_id_is_a_400(ports):
    requests = message_requests(2)
    requests[1]["custom_id"] = requests[0]["custom_id"]
    with pytest.raises(anthropic.BadRequestError):
        anthropic_client(ports).messages.batches.create(requests=requests)


def test_results_before_the_end_are_a_400(ports):
    client = anthropic_client(ports)
    batch = client.messages.batches.create(requests=message_requests(3))
    response = httpx.get(
        f"http://127.0.0.1:{ports['an']}/v1/messages/batches/{batch.id}/results",
        headers={"x-api-key": "sk-t", "anthropic-version": "2023-06-01"},
    )
    assert response.status_code == 400 and response.json()["type"] == "error"
