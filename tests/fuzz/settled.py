"""What a stack must look like once every request is over: nothing held, nothing claimed."""

from __future__ import annotations

import contextlib

import redis

from tests.e2e.brokerstate import bucket_available
from tests.stack import Stack, wait_until


def jobs_finished(stack: Stack, timeout: float = 60) -> None:
    def done() -> bool:
        [(open_jobs,)] = stack.sql(
            "select count(*) from gateway_job where status in ('queued', 'running')"
        )
        return open_jobs == 0

    wait_until(done, timeout=timeout, what="every deferred job to finish", interval=0.5)


def leftovers(stack: Stack) -> dict[str, object]:
    """Concurrency buckets below capacity, leases still indexed, Idempotency-Keys still
    claimed by a request in flight: all empty when nothing is running."""
    short = {}
    for name, capacity in stack.sql(
        "select name, capacity from quotas_bucket where dimension = 'concurrency'"
    ):
        available = bucket_available(stack, name)
        if available < float(capacity):
            short[name] = available
    client = redis.Redis.from_url(stack.redis_url)
    try:
        leases = client.zcard(f"{stack.name}:leases")
        records = (
            client.hgetall(key)
            for key in client.scan_iter(match=f"{stack.name}:idempotency:*", count=1000)
        )
        # Named by the request that claimed it (its generation id): GET /v1/generation?id=…
        pending = [r[b"owner"].decode() for r in records if r.get(b"state") == b"pending"]
    finally:
        client.close()
    found: dict[str, object] = {}
    if short:
        found["buckets below capacity"] = short
    if leases:
        found["leases indexed"] = leases
    if pending:
        found["idempotency keys still claimed"] = pending
    return found


def settle(stack: Stack, timeout: float = 30) -> dict[str, object]:
    """Wait for jobs and leases to settle; what is still left over after ``timeout``."""
    jobs_finished(stack)
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: not leftovers(stack), timeout=timeout, what="leases to settle")
    return leftovers(stack)
