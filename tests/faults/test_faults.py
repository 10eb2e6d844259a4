"""The fault suite (issue 13): five faults on a real deployment under an open-loop load, each
followed by the same checks — nothing admitted over the provider's limits (the simulator's
429s and peak in flight), every concurrency bucket back to full once the leases ran out, every
answered request in the ledger, every job finished once with one provider call per attempt the
ledger shows, and requests served again within the stated time after the fault's end.

Each test has a deployment of its own (PostgreSQL cluster, Redis server, simulator, gateway
with 2 workers, Celery worker), so the tests share no state and may run in parallel processes
(``python -m bench.faults`` does, and writes their figures to bench/results/faults.md).
"""

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.faults.harness import (
    JOB_RECOVERY_BOUND_SECONDS,
    PROVIDER,
    RECOVERY_BOUND_SECONDS,
    Deployment,
    measure,
    run_load,
)
from tests.stack import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def deployment(tmp_path):
    running = Deployment(tmp_path)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def figures_after(deployment, fault, name, *, recovery_bound=RECOVERY_BOUND_SECONDS):
    load = asyncio.run(run_load(deployment.stack, fault))
    return measure(deployment.stack, load, name, recovery_bound=recovery_bound)


def test_postgresql_restart(deployment):
    figures = figures_after(deployment, deployment.postgres.restart, "postgresql_restart")

    assert figures.problems() == []


def test_redis_restart_empty(deployment):
    def restart_empty():
        deployment.redis.kill()
        deployment.redis.start()

    figures = figures_after(deployment, restart_empty, "redis_restart_empty")

    assert figures.problems() == []


def test_redis_stopped_for_10_s(deployment):
    def outage():
        deployment.redis.stop()
        time.sleep(10)
        deployment.redis.start()

    figures = figures_after(deployment, outage, "redis_stopped_10s")

    assert figures.problems() == []


def connections_held(pid: int, port: int) -> int:
    """Established connections to ``port`` whose socket this process holds (/proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    held = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local_port, state, inode = (
                    int(fields[1].rsplit(":", 1)[1], 16),
                    fields[3],
                    fields[9],
                )
                held += local_port == port and state == "01" and inode in inodes
    return held


def test_gateway_worker_killed_mid_stream(deployment):
    stack = deployment.stack
    workers = [
        pid
        for pid in children(stack.processes["gateway"].pid)
        if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(workers) == 2, workers

    def kill_one():
        # Most of the requests in flight then are streams (they last longest). The kernel may
        # have handed them all to one worker: kill the one holding the most connections.
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: in_flight(stack) >= 4, timeout=10, what="requests in flight")
        held = {pid: connections_held(pid, stack.gateway_port) for pid in workers}
        os.kill(max(workers, key=held.__getitem__), signal.SIGKILL)

    figures = figures_after(deployment, kill_one, "gateway_worker_killed")

    assert figures.problems() == []
    assert any("cut off" in status for status in figures.failed_by_status), "it held requests"


def test_celery_worker_killed_mid_job(deployment):
    stack = deployment.stack

    def kill_mid_job():
        wait_until(
            lambda: stack.sql("select count(*) from gateway_job where status = 'running'")[0][0],
            timeout=10,
            what="a job running",
            interval=0.05,
        )
        process = stack.processes["celery"]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        stack._start_celery()  # as its supervisor would

    figures = figures_after(
        deployment,
        kill_mid_job,
        "celery_worker_killed",
        recovery_bound=JOB_RECOVERY_BOUND_SECONDS,
    )

    assert figures.problems() == []
    assert figures.jobs_run_again > 0, "a job was running"


def in_flight(stack) -> int:
    return httpx.get(f"{stack.sim_url(PROVIDER)}/_stats").json()["concurrency"]


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)
