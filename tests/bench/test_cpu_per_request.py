"""The CPU benchmark's stack stops whole (bench/cpu_per_request.py ``Processes.stop``)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from bench import cpu_per_request
from bench.cpu_per_request import Processes, tree, workers


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


def test_a_child_that_ends_while_the_workers_are_listed_is_not_one_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--fresh`` lists the workers while the ones it replaced are still ending: a child
    listed and gone before its command line is read is skipped, not an error."""
    processes = Processes(tmp_path)
    # a worker as the benchmark knows one: a child whose command line names uvicorn
    sleeper = "python3 -c 'import time; time.sleep(300)' uvicorn & wait"
    server = processes.spawn("server", ["bash", "-c", sleeper])
    try:
        deadline = time.monotonic() + 10
        # bash runs the background command in a subshell of its own, which may fork again
        # before python3 starts: the worker is the python3 process, whichever its parent
        while not (pythons := [pid for pid in tree(server)[1:] if is_python(pid)]):
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.05)
        [worker] = pythons
        ended = subprocess.Popen(["true"])
        ended.wait()  # reaped: its /proc entry is gone
        with monkeypatch.context() as patch:
            patch.setattr(cpu_per_request, "children", lambda pid: [ended.pid, worker])
            found = workers(server)
        assert found == [worker]
    finally:
        processes.stop()


def is_python(pid: int) -> bool:
    try:
        program = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return Path(program.decode()).name.startswith("python")
