"""Allowances through the real stack (quotas/allowances.py, ``BROKER_ALLOWANCE_REQUESTS``):
requests whose buckets have plenty left are granted from the gateway's allowance instead of
reserving one by one, and afterwards the buckets hold exactly what reserving one by one would
have left — every slot back, the tenant's daily tokens down by what the answers used — with a
reservation row for every request in the ledger.

The same, with the quota and routing cores compiled by mypyc (``gateway.serve``,
``common.compiled_cores``), as a gateway runs them once a build exists: the same levels, the
same rows.
"""

import os
from pathlib import Path

import httpx
import pytest

from common import compiled_cores
from tests.e2e.brokerstate import bucket_available
from tests.stack import SCRAPE_TOKEN, Stack, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-sy-test-acme-web-0001"  # app web: 20 concurrent requests


@pytest.fixture(scope="module", params=["pure", "compiled"])
def stack(request):
    if request.param == "compiled":
        compiled_cores.build()  # ~1 minute the first time on a machine; then found in its cache
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        latency_scale=0.05,
        gateway_workers=2,
        extra_env={"BROKER_ALLOWANCE_REQUESTS": "4", "SWITCHYARD_CORES": request.param},
    )
    try:
        yield running.start()
    finally:
        running.stop()


def worker_pids(stack) -> list[int]:
    """The gateway's workers: the supervisor's spawned children (not multiprocessing's
    resource tracker)."""
    supervisor = stack.processes["gateway"].pid
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return [int(p) for p in children if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


def test_each_worker_runs_the_cores_it_was_told_to(stack):
    cores = stack.extra_env["SWITCHYARD_CORES"]
    build = compiled_cores.cached(compiled_cores.build_key())
    assert len(worker_pids(stack)) == 2
    for pid in worker_pids(stack):
        mapped = Path(f"/proc/{pid}/maps").read_text()
        if cores == "compiled":  # the build's shared library, at least, is loaded
            assert build is not None and f"{build.path}/" in mapped, stack.log("gateway")
        else:
            assert "__mypyc" not in mapped
    said = "cores compiled by mypyc" if cores == "compiled" else "cores run as pure Python"
    started = [line for line in stack.log("gateway").splitlines() if "started worker" in line]
    assert len(started) == 2 and all(said in line for line in started), stack.log("gateway")


def allowance_grants(stack) -> float:
    response = httpx.get(
        f"{stack.base_url}/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"}
    )
    for line in response.text.splitlines():
        if line.startswith("switchyard_broker_allowance_grants_total "):
            return float(line.split()[1])
    return 0.0


def test_requests_granted_from_allowances_leave_the_buckets_as_reserving_one_by_one_would(
    stack,
):
    tokens_before = bucket_available(stack, "tenant:acme:total_tokens:day")
    ids, used = [], 0
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        for n in range(24):
            response = client.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {KEY}"},
                json={
                    "model": "acme/chat-small",
                    "messages": [{"role": "user", "content": f"allowance {n}"}],
                    "max_tokens": 50,
                    "provider": {"only": ["alpha"]},
                },
            )
            assert response.status_code == 200, response.text
            ids.append(response.json()["id"])
            used += response.json()["usage"]["total_tokens"]
    assert allowance_grants(stack) >= 12  # most: 2 at a time (a tenth of the app's 20 slots)

    # An allowance grants for a second at most; a used one takes the next shortly before its
    # end, which grants nothing and ends a second later: each is then reconciled.
    wait_until(
        lambda: bucket_available(stack, "app:acme/search/web:concurrency") == 20,
        timeout=5,
        what="every slot back",
    )
    assert bucket_available(stack, "tenant:acme:total_tokens:day") == tokens_before - used

    def rows():
        return stack.sql(
            "select request_id, outcome from quotas_reservation where request_id = any(%s)", ids
        )

    wait_until(lambda: len(rows()) == len(ids), timeout=20, what="a reservation row each")
    assert {outcome for _, outcome in rows()} == {"reconciled"}
