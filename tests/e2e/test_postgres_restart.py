"""A PostgreSQL restart (I1): the proxy's database reads and writes — the generation record,
a job's state, a deferred submission — work again within seconds, as the admin's do.

The stack runs on a PostgreSQL cluster of this module's own (initdb + pg_ctl in a temporary
directory), so restarting it disturbs no other test."""

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time

import httpx
import pytest

from tests.conftest import Blackhole
from tests.e2e.test_jobs import ASYNC, INDEXER_KEY, finished, submit, with_bulk_app
from tests.stack import Stack, free_port

pytestmark = pytest.mark.e2e

RECOVERY_SECONDS = 5.0


class Cluster:
    """A throwaway PostgreSQL server, restartable."""

    def __init__(self) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
        if not bins:
            pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl)")
        self.bin = bins[-1]
        self.dir = tempfile.mkdtemp(prefix="sy-pg-")
        self.data = os.path.join(self.dir, "pg")
        self.port = free_port()
        os.mkdir(self.data)
        if os.getuid() == 0:  # initdb refuses root
            shutil.chown(self.dir, "postgres")
            shutil.chown(self.data, "postgres")
            os.chmod(self.dir, 0o755)
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres")
        self.start()

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        command = [os.path.join(self.bin, tool), *args]
        if os.getuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = os.path.join(self.data, "server.log")
        self._run("pg_ctl", "-D", self.data, "-l", log, "-w", "-o", options, "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    running = Cluster()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def stack(cluster):
    blackhole = Blackhole()
    running = Stack(
        database_url=cluster.url,
        redis_url=os.environ["REDIS_URL"],
        latency_scale=0.05,
        config_edit=with_bulk_app(blackhole.port, free_port()),
        extra_env={"JOB_LEASE_SECONDS": "3", "JOB_RESUME_INTERVAL": "1"},
    )
    try:
        yield running.start()
    finally:
        running.stop()
        blackhole.close()


def answered_within(seconds: float, request) -> tuple[httpx.Response, float]:
    """The first 2xx answer of ``request`` (tried every 0.2 s), and how long it took."""
    started = time.monotonic()
    while True:
        response = request()
        took = time.monotonic() - started
        if response.status_code < 300 or took > seconds:
            return response, took
        time.sleep(0.2)


def test_the_proxy_reads_and_writes_the_database_again_within_seconds_of_a_restart(cluster, stack):
    accepted = submit(stack)
    assert accepted.status_code == 202, accepted.text
    done = finished(stack, accepted.headers["location"])
    headers = {"Authorization": f"Bearer {INDEXER_KEY}"}
    generation = f"{stack.base_url}/v1/generation?id={done['generation_id']}"
    job = f"{stack.base_url}{accepted.headers['location']}"
    # Every path holds a connection before the restart (the ledger writes the record shortly).
    assert answered_within(10, lambda: httpx.get(generation, headers=headers))[0].status_code == 200
    assert httpx.get(job, headers=headers).status_code == 200

    cluster.stop()
    cluster.start()
    with socket.create_connection(("127.0.0.1", cluster.port), timeout=5):
        pass

    record, took = answered_within(RECOVERY_SECONDS, lambda: httpx.get(generation, headers=headers))
    assert record.status_code == 200, (record.status_code, record.text)
    assert took < RECOVERY_SECONDS
    state, took = answered_within(RECOVERY_SECONDS, lambda: httpx.get(job, headers=headers))
    assert state.status_code == 200, (state.status_code, state.text)
    assert state.json()["status"] == "succeeded"
    again, took = answered_within(RECOVERY_SECONDS, lambda: submit(stack, headers=ASYNC))
    assert again.status_code == 202, (again.status_code, again.text)
    assert took < RECOVERY_SECONDS
    assert finished(stack, again.headers["location"])["status"] == "succeeded"
