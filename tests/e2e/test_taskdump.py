"""``kill -USR1 <gateway pid>`` writes every asyncio task's await chain to the gateway's log
(gateway/taskdump.py): what a hung request waits on, and the worker goes on serving."""

import os
import signal

import httpx
import pytest

from tests.stack import wait_until

pytestmark = pytest.mark.e2e


def test_sigusr1_writes_the_tasks_to_the_log_and_the_gateway_goes_on(stack):
    before = stack.log("gateway").count("--- end of tasks ---")

    os.kill(stack.processes["gateway"].pid, signal.SIGUSR1)

    wait_until(
        lambda: stack.log("gateway").count("--- end of tasks ---") > before,
        timeout=5,
        what="the task dump in the gateway's log",
    )
    dump = stack.log("gateway").rsplit("(SIGUSR1) ---", 1)[1]
    assert "Stack for <Task" in dump  # each task with its frames
    assert httpx.get(f"{stack.base_url}/healthz", timeout=5).status_code == 200
