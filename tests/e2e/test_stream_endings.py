"""A stream the client leaves is settled at once, whenever it leaves (SPEC C8–C10, E3): its
grant is settled (no lease left), it has exactly one ledger row, and its Idempotency-Key is
no longer claimed ("still in progress" would refuse every retry until the key's 24 h TTL)."""

import contextlib
import time
import uuid

import httpx
import pytest
import redis

from tests.stack import wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-sy-test-acme-web-0001"


def test_a_client_that_leaves_while_the_stream_is_being_settled_leaves_nothing_claimed(stack):
    """The client reads the whole answer ([DONE]) and hangs up before the response's last
    (empty) chunk: the gateway is then settling the stream — reconcile, ledger row, the key's
    answer — and the disconnect cancels that work unless it is run to its end. Redis refusing
    writes for a moment holds the gateway at that step, so the client surely leaves there."""
    # Alpha slower (and without its random 500s) for a moment: the stream outlasts the pause.
    slow = {
        "model": "chat-large",
        "for": "3s",
        "error_rate": 0,
        "tokens_per_s": {"median": 1, "p05": 0.8},
    }
    assert httpx.post(f"{stack.sim_url('alpha')}/_incident", json=slow).status_code == 200
    idempotency_key = f"order-{uuid.uuid4().hex}"
    payload = {
        "model": "acme/chat-large",
        "messages": [{"role": "user", "content": "a short story"}],
        "max_tokens": 20,
        "stream": True,
        "provider": {"only": ["alpha"]},
    }
    store = redis.Redis.from_url(stack.redis_url)
    try:
        with (
            httpx.Client(timeout=30) as client,
            client.stream(
                "POST",
                f"{stack.base_url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {KEY}", "Idempotency-Key": idempotency_key},
                json=payload,
            ) as response,
        ):
            assert response.status_code == 200
            generation = response.headers["x-request-id"]
            lines = response.iter_lines()
            assert next(lines).startswith("data: {")
            # From here every write to Redis waits (EVALSHA included), reads do not.
            store.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
            assert "data: [DONE]" in lines, "the answer ended before its [DONE]"
            # Leaving the block closes the connection before the response is complete.
        time.sleep(0.5)  # the gateway sees the connection closed (it is waiting for Redis)
    finally:
        store.execute_command("CLIENT", "UNPAUSE")
        store.close()

    # Once Redis takes writes again: the row (through Celery), the settled reservation, no
    # lease, and the key holding its answer ("streamed": a repeat is told which generation).
    settled = {
        "ledger": [(200, "ok")],
        "reservations": [("reconciled",)],
        "leases": [],
        "idempotency keys": ["streamed"],
    }
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: left_by(stack, generation) == settled, timeout=10, what="settling")
    assert left_by(stack, generation) == settled
    wait_until(lambda: not sim_incidents(stack), timeout=5, what="the slow-down to end")


def left_by(stack, generation: str) -> dict[str, list]:
    """What one request left: its ledger and reservation rows, leases, Idempotency-Key states."""
    return {
        "ledger": stack.sql(
            "select status, reason_code from gateway_generation where id = %s", generation
        ),
        "reservations": stack.sql(
            "select outcome from quotas_reservation where request_id = %s", generation
        ),
        "leases": leased(stack, generation),
        "idempotency keys": key_states(stack, generation),
    }


def leased(stack, generation: str) -> list[bytes]:
    client = redis.Redis.from_url(stack.redis_url)
    try:
        return [m for m in client.zrange(f"{stack.name}:leases", 0, -1) if generation.encode() in m]
    finally:
        client.close()


def key_states(stack, generation: str) -> list[str]:
    """The state of every Idempotency-Key record this generation owns (pending: claimed)."""
    client = redis.Redis.from_url(stack.redis_url)
    try:
        records = (
            client.hgetall(key)
            for key in client.scan_iter(match=f"{stack.name}:idempotency:*", count=1000)
        )
        return [r[b"state"].decode() for r in records if r.get(b"owner") == generation.encode()]
    finally:
        client.close()


def sim_incidents(stack) -> list:
    return httpx.get(f"{stack.sim_url('alpha')}/_stats").json()["incidents"]
