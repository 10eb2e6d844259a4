"""One ledger row per request, written off the hot path; a client disconnect cancels upstream."""

import asyncio

import httpx
import pytest

from quotas.allowances import IDLE_AFTER
from tests.e2e.brokerstate import bucket_available
from tests.stack import wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-sy-test-acme-web-0001"


def test_it_writes_one_ledger_row_per_request_through_celery(stack):
    response = httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "acme/chat-small", "messages": [{"role": "user", "content": "ledger me"}]},
        timeout=30,
    )
    assert response.status_code == 200
    generation_id = response.json()["id"]
    usage = response.json()["usage"]
    served_by = response.headers["x-switchyard-provider"]

    def stored():
        return stack.sql(
            "select provider, status, input_tokens, output_tokens, cost, model, tenant_id"
            " from gateway_generation where id = %s",
            generation_id,
        )

    wait_until(lambda: bool(stored()), timeout=15, what="the ledger row (Celery beat flush)")
    [(provider, status, input_tokens, output_tokens, cost, model, tenant_id)] = stored()
    assert (provider, status, model) == (served_by, 200, "acme/chat-small")
    assert (input_tokens, output_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert float(cost) == pytest.approx(usage["cost"], rel=1e-6)
    [(acme_id,)] = stack.sql("select id from tenants_tenant where name = 'acme'")
    assert tenant_id == acme_id


def test_it_records_each_reservation_and_how_it_was_settled(stack):
    response = httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "model": "acme/chat-small",
            "messages": [{"role": "user", "content": "reserve me"}],
            "max_tokens": 300,
            "provider": {"only": ["alpha"]},
        },
        timeout=30,
    )
    assert response.status_code == 200
    usage = response.json()["usage"]

    def rows():
        return stack.sql(
            "select outcome, taken, settled, estimated_output_tokens, actual_input_tokens,"
            " actual_output_tokens from quotas_reservation where request_id = %s",
            response.json()["id"],
        )

    wait_until(lambda: bool(rows()), timeout=15, what="the reservation ledger row")
    [(outcome, taken, settled, estimated_output, actual_input, actual_output)] = rows()
    assert outcome == "reconciled"
    assert estimated_output == 300
    assert (actual_input, actual_output) == (usage["prompt_tokens"], usage["completion_tokens"])
    # The request took from its app's concurrency, its tenant's daily tokens and alpha's limits.
    assert {
        "app:acme/search/web:concurrency",
        "tenant:acme:total_tokens:day",
        "provider:alpha:requests:1m",
        "provider:alpha:output_tokens:1m",
    } <= set(taken)
    # Output was reserved at max_tokens (300) and reconciled to what was really produced.
    output = settled["provider:alpha:output_tokens:1m"]
    assert output["released"] == 300 - usage["completion_tokens"]


def test_it_cancels_the_upstream_call_when_the_client_disconnects(stack):
    stats = f"{stack.sim_url('alpha')}/_stats"
    # Slow alpha's chat-large down for a moment so the stream is surely still running.
    slow = {"model": "chat-large", "for": "1s", "tokens_per_s": {"median": 2, "p05": 1}}
    assert httpx.post(f"{stack.sim_url('alpha')}/_incident", json=slow).status_code == 200
    payload = {
        "model": "acme/chat-large",
        "messages": [{"role": "user", "content": "write a long story"}],
        "max_tokens": 4000,
        "stream": True,
        "provider": {"only": ["alpha"]},
    }
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            f"{stack.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json=payload,
        ) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()  # kept: dropping the iterator closes the stream
        assert next(lines).startswith("data: ")
        assert httpx.get(stats).json()["concurrency"] >= 1
        # Leaving the block closes the connection mid-stream.
    wait_until(
        lambda: httpx.get(stats).json()["concurrency"] == 0,
        timeout=5,
        what="the simulator to see the upstream call cancelled",
    )
    wait_until(
        lambda: not httpx.get(stats).json()["incidents"], timeout=5, what="the slow-down to end"
    )

    def cancelled_rows():
        return stack.sql(
            "select status, reason_code from gateway_generation where cancelled and streamed"
        )

    wait_until(
        lambda: bool(cancelled_rows()), timeout=15, what="the cancelled request's ledger row"
    )
    assert cancelled_rows()[0] == (499, "client_disconnected")


def test_it_gives_back_the_slot_and_records_a_client_that_leaves_before_the_answer(stack):
    # Not streamed, to a provider that never answers (its read timeout is 3 s): the client
    # gives up after a second, while the attempt is surely still in flight.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{stack.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"model": "e2e/hanging", "messages": [{"role": "user", "content": "hello?"}]},
            timeout=httpx.Timeout(30, read=1.0),
        )
    # The slot comes back at once, not when the 30 s lease runs out (C9, C10). (An allowance
    # that holds slots of the app gives them back IDLE_AFTER after its last request.)
    wait_until(
        lambda: bucket_available(stack, "app:acme/search/web:concurrency") == 20,
        timeout=1.5 + IDLE_AFTER,
        what="the app's concurrency slot to come back",
    )

    def rows():
        return stack.sql(
            "select status, reason_code, provider from gateway_generation"
            " where cancelled and not streamed"
        )

    wait_until(lambda: bool(rows()), timeout=15, what="the abandoned request's ledger row")
    assert rows()[0] == (499, "client_disconnected", "hanging")


def test_it_records_a_client_that_leaves_while_its_request_waits_for_capacity(stack):
    """The app's 20 concurrent slots are all held by requests to a provider that never
    answers; a 21st request waits in the fair queue, and its client gives up there."""
    started = stack.sql("select now()")[0][0]

    async def scene() -> None:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=32)) as client:
            holders = [
                asyncio.create_task(
                    client.post(
                        f"{stack.base_url}/v1/chat/completions",
                        headers={"Authorization": f"Bearer {KEY}"},
                        json={
                            "model": "e2e/hanging",
                            "messages": [{"role": "user", "content": "x"}],
                        },
                        timeout=30,
                    )
                )
                for _ in range(20)
            ]
            await asyncio.sleep(0.5)
            with pytest.raises(httpx.ReadTimeout):
                await client.post(
                    f"{stack.base_url}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {KEY}"},
                    json={
                        "model": "acme/chat-small",
                        "messages": [{"role": "user", "content": "q"}],
                    },
                    timeout=httpx.Timeout(30, read=1.0),
                )
            for holder in holders:  # their clients leave too: the slots come back
                holder.cancel()
            await asyncio.gather(*holders, return_exceptions=True)

    asyncio.run(scene())

    def rows():
        return stack.sql(
            "select status, reason_code, cancelled, attempts from gateway_generation"
            " where model = 'acme/chat-small' and created_at >= %s and status = 499",
            started,
        )

    wait_until(lambda: bool(rows()), timeout=15, what="the queued request's ledger row")
    assert rows() == [(499, "client_disconnected", True, 0)]
    wait_until(
        lambda: bucket_available(stack, "app:acme/search/web:concurrency") == 20,
        timeout=5,
        what="every slot to come back",
    )
