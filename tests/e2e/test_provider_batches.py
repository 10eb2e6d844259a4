"""Batches sent to a provider's own batch API (E5) end to end: the official ``openai`` SDK's
files.create + batches.create + polling + files.content, with the gateway sending the lines to
the simulator's batch API (OpenAI's batches for alpha, Anthropic's message batches for beta)
instead of calling it line by line; the ledger at the batch price; cancel; and a Celery worker
SIGKILLed while the provider batch is in flight."""

from __future__ import annotations

import os
import signal
import time
from decimal import Decimal

import httpx
import pytest
import yaml

from tests.e2e.batch_support import (
    batch_file,
    batch_wait,
    market_without_failures,
    output_lines,
    sdk,
)
from tests.e2e.brokerstate import bucket_available
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.e2e

SMALL = "acme/chat-small"  # alpha (OpenAI wire) offers its batch API for it
LARGE = "acme/chat-large"  # beta (Anthropic wire) offers its batch API for it
DISCOUNT = 0.5
SPEND = "tenant:acme:spend:rolling-5h"  # acme's spend budget: 50 USD in 5 hours


def market(folder):
    path = market_without_failures(folder)
    data = yaml.safe_load(path.read_text())
    for provider in data["providers"]:
        if provider["name"] in ("alpha", "beta"):
            # 40 s at the stack's latency scale (0.05): the lines are answered over 2 s.
            provider["batch"] = {"discount": DISCOUNT, "turnaround": "40s"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def config_edit(config):
    for model in config["models"]:
        for endpoint in model["endpoints"]:
            if (model["slug"], endpoint["provider"]) in ((SMALL, "alpha"), (LARGE, "beta")):
                endpoint["batch"] = {"discount": DISCOUNT, "turnaround": "1h"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        market=market(tmp_path_factory.mktemp("market")),
        latency_scale=0.05,
        config_edit=config_edit,
        extra_env={
            "JOB_LEASE_SECONDS": "3",
            "JOB_RESUME_INTERVAL": "1",
            "PROVIDER_BATCH_POLL_SECONDS": "0.3",
        },
    )
    try:
        yield running.start()
    finally:
        running.stop()


def sim_stats(stack, provider):
    return httpx.get(f"{stack.sim_url(provider)}/_stats", timeout=10).json()


def live_calls(stack, tag):
    """Live calls that reached alpha, beta or gamma for this batch's lines (by end user)."""
    total = 0
    for provider in ("alpha", "beta", "gamma"):
        calls = httpx.get(f"{stack.sim_url(provider)}/_calls", timeout=10).json()["by_caller"]
        total += sum(n for caller, n in calls.items() if caller.startswith(tag))
    return total


def submit(client, content, model_lines=None, metadata=None):
    uploaded = client.files.create(file=("lines.jsonl", content), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=metadata,
    )


def lines_for(model, n, tag):
    return batch_file(n, tag=tag).replace(b'"acme/chat-small"', f'"{model}"'.encode())


def ledger_rows(stack, generation_ids):
    def rows():
        return stack.sql(
            "SELECT provider, cost, input_tokens, cached_input_tokens, output_tokens "
            "FROM gateway_generation WHERE id = ANY(%s)",
            list(generation_ids),
        )

    wait_until(lambda: len(rows()) == len(generation_ids), timeout=30, what="ledger rows")
    return rows()


def test_it_sends_a_batch_to_an_openai_wire_providers_batch_api_and_reconciles_it(stack):
    client = sdk(stack)
    before = sim_stats(stack, "alpha")["batch"]
    spend_before = bucket_available(stack, SPEND)
    created = submit(client, lines_for(SMALL, 40, "pb-oa"))
    seen = set()  # the counts shown while the provider worked
    deadline = time.monotonic() + 120
    while (done := client.batches.retrieve(created.id)).status not in ("completed", "failed"):
        seen.add(done.request_counts.completed)
        assert time.monotonic() < deadline, done
        time.sleep(0.1)

    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (40, 0)
    records = output_lines(client, done.output_file_id)
    assert sorted(r["custom_id"] for r in records) == [f"pb-oa-{n:05d}" for n in range(40)]
    for record in records:
        body = record["response"]["body"]
        assert record["response"]["status_code"] == 200 and record["error"] is None
        assert body["object"] == "chat.completion" and body["model"] == SMALL
        assert body["provider"] == "alpha" and body["choices"][0]["message"]["content"]
    # At the simulator: every line went through alpha's batch API, once; none was called live.
    after = sim_stats(stack, "alpha")["batch"]
    assert after["batches"] - before["batches"] == 1
    assert after["succeeded"] - before["succeeded"] == 40
    assert after["custom_ids"] - before["custom_ids"] == 40
    assert after["custom_ids_repeated"] == 0
    assert live_calls(stack, "pb-oa") == 0
    # The ledger: one row a line, at alpha's chat-small prices less the batch discount.
    rows = ledger_rows(stack, {r["response"]["request_id"] for r in records})
    for provider, cost, input_tokens, cached, output_tokens in rows:
        full = ((input_tokens - cached) * 0.10 + cached * 0.01 + output_tokens * 0.30) / 1e6
        assert provider == "alpha"
        assert cost == pytest.approx(
            Decimal(str(round(full * (1 - DISCOUNT), 8))), abs=Decimal("1e-8")
        )
    assert sum(r[4] for r in rows) == after["output_tokens"] - before["output_tokens"]
    # request_counts followed the provider's progress, not only its end.
    assert any(0 < n < 40 for n in seen), seen
    # The tenant's spend budget was charged what the lines cost at the batch price.
    spent = float(sum(row[1] for row in rows))
    assert spend_before - bucket_available(stack, SPEND) == pytest.approx(spent, rel=1e-3)
    # The answer names the cost at the batch price too.
    usage = records[0]["response"]["body"]["usage"]
    assert usage["cost"] == pytest.approx(
        (usage["prompt_tokens"] * 0.10 + usage["completion_tokens"] * 0.30) / 1e6 * DISCOUNT,
        rel=0.2,  # cached input, if any, is cheaper still
    )


def test_it_sends_a_batch_to_an_anthropic_wire_providers_message_batches(stack):
    client = sdk(stack)
    before = sim_stats(stack, "beta")["batch"]
    created = submit(client, lines_for(LARGE, 15, "pb-an"))
    done = batch_wait(client, created.id, timeout=120)

    assert done.status == "completed", done
    records = output_lines(client, done.output_file_id)
    assert len(records) == 15 and {r["response"]["status_code"] for r in records} == {200}
    assert {r["response"]["body"]["provider"] for r in records} == {"beta"}
    assert all(r["response"]["body"]["object"] == "chat.completion" for r in records)
    after = sim_stats(stack, "beta")["batch"]
    assert after["succeeded"] - before["succeeded"] == 15 and after["custom_ids_repeated"] == 0
    assert live_calls(stack, "pb-an") == 0
    rows = ledger_rows(stack, {r["response"]["request_id"] for r in records})
    assert {row[0] for row in rows} == {"beta"} and all(row[1] > 0 for row in rows)


def test_the_caller_keeps_the_line_by_line_path_with_its_metadata(stack):
    client = sdk(stack)
    before = sim_stats(stack, "alpha")["batch"]["batches"]
    created = submit(
        client, lines_for(SMALL, 5, "pb-lines"), metadata={"switchyard_batch_path": "lines"}
    )
    done = batch_wait(client, created.id, timeout=120)

    assert done.status == "completed" and done.request_counts.completed == 5
    assert sim_stats(stack, "alpha")["batch"]["batches"] == before
    assert live_calls(stack, "pb-lines") == 5  # each line called live, once


def test_lines_that_route_themselves_keep_the_line_by_line_path(stack):
    client = sdk(stack)
    before = sim_stats(stack, "alpha")["batch"]["batches"]
    content = lines_for(SMALL, 4, "pb-routed").replace(
        b'"max_tokens":16', b'"max_tokens":16,"provider":{"order":["gamma"]}'
    )
    assert content.count(b'"order"') == 4
    done = batch_wait(client, submit(client, content).id, timeout=120)

    assert done.status == "completed" and done.request_counts.completed == 4
    assert sim_stats(stack, "alpha")["batch"]["batches"] == before
    assert {
        r["response"]["body"]["provider"] for r in output_lines(client, done.output_file_id)
    } == {"gamma"}


def test_lines_the_provider_answers_5xx_run_here_line_by_line(stack):
    client = sdk(stack)
    before = sim_stats(stack, "alpha")["batch"]
    incident = {"model": "chat-small", "error_rate": 0.5, "for": "3s"}
    httpx.post(f"{stack.sim_url('alpha')}/_incident", json=incident, timeout=10).raise_for_status()
    created = submit(client, lines_for(SMALL, 30, "pb-5xx"))
    done = batch_wait(client, created.id, timeout=120)

    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (30, 0)
    records = output_lines(client, done.output_file_id)
    assert len(records) == 30 and {r["response"]["status_code"] for r in records} == {200}
    after = sim_stats(stack, "alpha")["batch"]
    errored = after["errored"] - before["errored"]
    assert 0 < errored < 30 and after["succeeded"] - before["succeeded"] == 30 - errored
    # Each line the provider's batch failed was called live here (retried if it failed again).
    assert live_calls(stack, "pb-5xx") >= errored
    assert after["custom_ids_repeated"] == 0


def test_it_forwards_a_cancel_to_the_provider(stack):
    client = sdk(stack)
    before = sim_stats(stack, "alpha")["batch"]
    created = submit(client, lines_for(SMALL, 400, "pb-cancel"))
    wait_until(
        lambda: stack.sql("SELECT provider_batch_id FROM gateway_batch WHERE id = %s", created.id)[
            0
        ][0],
        timeout=60,
        what="the provider batch",
    )
    cancelling = client.batches.cancel(created.id)
    done = batch_wait(client, created.id, timeout=60)

    assert cancelling.status == "cancelling"
    assert done.status == "cancelled" and done.cancelled_at
    counts = done.request_counts
    assert counts.completed < 400 and counts.completed + counts.failed == 400
    answered = output_lines(client, done.output_file_id)
    not_run = output_lines(client, done.error_file_id)
    assert len(answered) == counts.completed and len(not_run) == counts.failed > 0
    assert {r["error"]["code"] for r in not_run} == {"batch_cancelled"}
    after = sim_stats(stack, "alpha")["batch"]
    assert after["cancelled"] - before["cancelled"] == 1
    assert after["succeeded"] - before["succeeded"] == counts.completed
    assert live_calls(stack, "pb-cancel") == 0


def test_a_provider_batch_the_provider_lost_runs_its_lines_here(stack):
    client = sdk(stack)
    created = submit(client, lines_for(SMALL, 30, "pb-lost"))
    wait_until(
        lambda: stack.sql("SELECT provider_batch_id FROM gateway_batch WHERE id = %s", created.id)[
            0
        ][0],
        timeout=60,
        what="the provider batch",
    )
    httpx.post(f"{stack.sim_url('alpha')}/_reset", timeout=10)  # alpha forgets its batches
    done = batch_wait(client, created.id, timeout=120)

    assert done.status == "completed" and done.request_counts.completed == 30
    assert live_calls(stack, "pb-lost") == 30  # each line called live here, once
    assert sim_stats(stack, "alpha")["batch"]["lines"] == 0  # the lost batch answered none


def test_a_worker_killed_while_the_provider_batch_runs_still_completes_every_line_once(stack):
    client = sdk(stack)
    before = sim_stats(stack, "alpha")["batch"]
    created = submit(client, lines_for(SMALL, 200, "pb-kill"))
    wait_until(
        lambda: stack.sql("SELECT provider_batch_id FROM gateway_batch WHERE id = %s", created.id)[
            0
        ][0],
        timeout=60,
        what="the provider batch",
    )
    celery = stack.processes["celery"]
    os.killpg(celery.pid, signal.SIGKILL)  # mid-poll: the worker, its pool and beat
    celery.wait(timeout=10)
    in_flight = client.batches.retrieve(created.id)
    assert in_flight.status == "in_progress" and in_flight.request_counts.completed < 200
    time.sleep(1.0)
    stack._start_celery()
    done = batch_wait(client, created.id, timeout=180)

    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (200, 0)
    records = output_lines(client, done.output_file_id)
    assert sorted(r["custom_id"] for r in records) == [f"pb-kill-{n:05d}" for n in range(200)]
    after = sim_stats(stack, "alpha")["batch"]
    assert after["batches"] - before["batches"] == 1  # the resumed driver made no second batch
    assert after["succeeded"] - before["succeeded"] == 200 and after["custom_ids_repeated"] == 0
    assert live_calls(stack, "pb-kill") == 0
    assert len(ledger_rows(stack, {r["response"]["request_id"] for r in records})) == 200
