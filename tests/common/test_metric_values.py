"""Multiprocess metrics (common/metric_values.py): an increment asks the kernel nothing, and a
forked child still counts into a file of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    from prometheus_client import CollectorRegistry, multiprocess

    from quotas.metrics import BROKER_ALLOWANCE_GRANTS
    from gateway.metrics import ATTEMPTS, child

    parent = os.getpid()
    asked = []

    def watch(frame, event, arg):  # C functions called, as a profiler sees them
        if event == "c_call" and arg is os.getpid:
            asked.append(frame.f_code.co_name)

    sys.setprofile(watch)
    BROKER_ALLOWANCE_GRANTS.inc()
    child(ATTEMPTS, "mock-a", "ok").inc(2)
    sys.setprofile(None)
    assert not asked, f"increments asked for the process id: {asked}"

    pid = os.fork()
    if pid == 0:
        child(ATTEMPTS, "mock-a", "ok").inc(5)
        BROKER_ALLOWANCE_GRANTS.inc()
        os._exit(0)
    os.waitpid(pid, 0)
    child(ATTEMPTS, "mock-a", "ok").inc(1)

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    attempts = registry.get_sample_value(
        "switchyard_upstream_attempts_total", {"provider": "mock-a", "outcome": "ok"}
    )
    grants = registry.get_sample_value("switchyard_broker_allowance_grants_total")
    folder = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    files = sorted(name for name in os.listdir(folder) if name.startswith("counter_"))
    print(attempts, grants, files == [f"counter_{parent}.db", f"counter_{pid}.db"], flush=True)
    """
)


def test_increments_need_no_process_id_and_a_forked_child_counts_apart(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # parent 2 + 1, child 5 (in its own file, not over the parent's); grants 1 + 1
    assert done.stdout.split() == ["8.0", "2.0", "True"]
