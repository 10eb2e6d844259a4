"""The gateway's runner (gateway/serve.py): each worker listens on a socket of its own, so new
connections are spread over the workers by the kernel, not taken by whichever is awake; a
worker runs the cores compiled by mypyc when a build of the exact sources exists."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from common import compiled_cores
from gateway import serve
from tests.stack import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]


class Runner:
    def __init__(self, workers: int, log: Path) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway.serve", "--port", str(self.port),
             "--workers", str(workers), "--app", "tests.pid_app:app"],
            cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_until(lambda: len(self.pids(32)) == workers, timeout=30, what="the workers")

    def pids(self, connections: int) -> Counter[int]:
        """Which worker answered, over ``connections`` connections opened at once."""

        async def hit() -> list[int]:
            connector = aiohttp.TCPConnector(limit=connections, force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def one() -> int:
                    async with session.get(f"http://127.0.0.1:{self.port}/") as response:
                        return int(await response.text())

                return await asyncio.gather(*(one() for _ in range(connections)))

        try:
            return Counter(asyncio.run(hit()))
        except aiohttp.ClientError:
            return Counter()

    def listening_sockets(self) -> int:
        """Sockets listening on the port (``/proc/net/tcp``, state 0A)."""
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
        return sum(
            1
            for line in lines
            if line.split()[1].endswith(f":{self.port:04X}") and line.split()[3] == "0A"
        )


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    running = Runner(2, tmp_path / "serve.log")
    yield running
    if running.process.poll() is None:
        running.process.kill()
        running.process.wait()


def test_each_worker_listens_on_a_socket_of_its_own(runner: Runner) -> None:
    assert runner.listening_sockets() == 2  # uvicorn --workers 2: one, shared


def test_connections_opened_together_are_served_by_both_workers(runner: Runner) -> None:
    served = runner.pids(32)
    assert sum(served.values()) == 32
    assert len(served) == 2, served


def test_a_worker_that_dies_is_replaced(runner: Runner) -> None:
    before = set(runner.pids(32))
    gone = min(before)
    os.kill(gone, signal.SIGKILL)
    wait_until(
        lambda: len(now := set(runner.pids(32))) == 2 and gone not in now,
        timeout=15,
        what="a new worker in place of the killed one",
    )


def test_sighup_replaces_every_worker_and_the_runner_goes_on(runner: Runner) -> None:
    """As uvicorn's and gunicorn's supervisors do (``bench/cpu_per_request.py --fresh``
    relies on it): a SIGHUP left to its default action would end the runner."""
    before = set(runner.pids(32))
    runner.process.send_signal(signal.SIGHUP)
    wait_until(
        lambda: len(now := set(runner.pids(32))) == 2 and not now & before,
        timeout=30,
        what="two new workers in place of the old ones",
    )
    wait_until(
        lambda: not [pid for pid in before if Path(f"/proc/{pid}").exists()],
        timeout=30,
        what="the old workers gone",
    )
    assert runner.process.poll() is None
    assert runner.listening_sockets() == 2


def test_sigterm_stops_every_worker_and_the_runner(runner: Runner) -> None:
    workers = set(runner.pids(32))
    runner.process.send_signal(signal.SIGTERM)
    assert runner.process.wait(timeout=30) == 0
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie nobody reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_workers_end_when_the_runner_is_killed_and_the_port_is_free_again(
    runner: Runner,
) -> None:
    workers = set(runner.pids(32))
    assert len(workers) == 2
    runner.process.kill()  # SIGKILL: the runner cannot stop them itself
    runner.process.wait()
    wait_until(lambda: not any(alive(p) for p in workers), timeout=15, what="the workers' end")
    assert not serve.port_taken("127.0.0.1", runner.port)


def test_a_port_another_server_listens_on_is_refused(runner: Runner, tmp_path: Path) -> None:
    """With ``SO_REUSEPORT`` a second runner's workers could bind beside the first's and take
    half its connections; it stops at once instead."""
    second = subprocess.run(
        [sys.executable, "-m", "gateway.serve", "--port", str(runner.port), "--workers", "2",
         "--app", "tests.pid_app:app"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert second.returncode == 3
    assert f"127.0.0.1:{runner.port} is in use" in second.stderr
    assert len(runner.pids(32)) == 2  # the first still serves, alone on the port
    assert runner.listening_sockets() == 2


def fake_build(cache: Path, key: str) -> Path:
    """A build directory as ``compiled_cores.build`` leaves it (an empty stand-in module)."""
    relative = f"quotas/core/book{compiled_cores.EXT_SUFFIX}"
    (cache / key / relative).parent.mkdir(parents=True)
    (cache / key / relative).write_bytes(b"")
    manifest = {"key": key, "files": {"quotas.core.book": relative}}
    (cache / key / compiled_cores.MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    return cache / key


def test_workers_run_compiled_cores_only_from_a_build_of_these_exact_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(compiled_cores.CACHE_ENV, str(tmp_path))
    build, which = serve.cores_build("auto")
    assert build is None
    assert which.startswith("cores run as pure Python") and "common.compiled_cores" in which
    fake_build(tmp_path, "0" * 32)  # a build of other sources
    assert serve.cores_build("auto")[0] is None
    ours = fake_build(tmp_path, compiled_cores.build_key())
    assert serve.cores_build("auto") == (str(ours), f"cores compiled by mypyc ({ours})")
    assert serve.cores_build("pure") == (None, "cores run as pure Python (SWITCHYARD_CORES=pure)")


def test_a_build_a_worker_cannot_load_leaves_its_cores_as_python(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Here the cores are imported already, as they would be by anything run before it."""
    import quotas.core.book

    book = quotas.core.book
    serve.load_cores(str(fake_build(tmp_path, compiled_cores.build_key())))
    assert sys.modules["quotas.core.book"] is book
    assert "cores run as pure Python: already imported as Python: quotas.core.book" in caplog.text


def test_a_cores_choice_it_does_not_know_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWITCHYARD_CORES", "yes")
    with pytest.raises(SystemExit) as exit:
        serve.main(["--port", str(free_port())])
    assert exit.value.code == 2
    assert "SWITCHYARD_CORES: one of auto, compiled, pure, not 'yes'" in capsys.readouterr().err
