"""The CPU benchmark's stack stops whole (bench/cpu_per_request.py ``Processes.stop``)."""

from __future__ import annotations

import time
from pathlib import Path

from bench.cpu_per_request import Processes, tree


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"  # a zombie has ended; its parent reaps it


def test_it_leaves_nothing_behind_that_ignores_sigterm_when_its_parent_is_stopped(
    tmp_path: Path,
) -> None:
    """A server whose worker ignores SIGTERM (as a gateway worker stuck in its shutdown does)
    and which itself dies on SIGTERM would leave the worker orphaned."""
    processes = Processes(tmp_path)
    server = processes.spawn(
        "server", ["bash", "-c", "bash -c 'trap \"\" TERM; exec sleep 300' & wait"]
    )
    deadline = time.monotonic() + 10
    while len(tree(server)) < 2:
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    [worker] = tree(server)[1:]
    processes.stop()
    deadline = time.monotonic() + 5
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker), f"worker {worker} outlived its server"
