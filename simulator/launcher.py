"""Start every provider of a market file, one process each, on ports chosen here.

The parent binds each listening socket itself (so port 0 resolves to a free port before anyone
needs to know it), hands it to a ``python -m simulator.server`` child, waits for every child's
``ready``, then writes the ready file: ``{"provider name": port, ...}`` as JSON, written to a
temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from simulator.model import Market

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


class LaunchError(RuntimeError):
    pass


def parse_port_overrides(text: str | None) -> dict[str, int]:
    """``alpha=0,beta=9202`` → ``{"alpha": 0, "beta": 9202}``."""
    overrides: dict[str, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, port = item.partition("=")
        if not sep or not name.strip() or not port.strip().isdigit() or int(port) > 65535:
            raise LaunchError(f"--ports: expected name=port, got {item.strip()!r}")
        overrides[name.strip()] = int(port)
    return overrides


def planned_ports(market: Market, overrides: Mapping[str, int], offset: int) -> dict[str, int]:
    """Each provider's port: its override, else the market's port plus ``offset`` (0 stays 0)."""
    unknown = set(overrides) - {provider.name for provider in market.providers}
    if unknown:
        raise LaunchError(f"--ports names unknown providers: {', '.join(sorted(unknown))}")
    ports = {}
    for provider in market.providers:
        if provider.name in overrides:
            ports[provider.name] = overrides[provider.name]
        else:
            ports[provider.name] = provider.port + offset if provider.port else 0
        if not 0 <= ports[provider.name] <= 65535:
            raise LaunchError(f"port for {provider.name} out of range: {ports[provider.name]}")
    return ports


def bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as error:
        sock.close()
        raise LaunchError(f"cannot listen on {HOST}:{port}: {error.strerror}") from None
    sock.listen(4096)
    sock.set_inheritable(True)
    return sock


@dataclass
class Cluster:
    """Running provider processes; ``ports`` maps provider name to its bound port."""

    ports: dict[str, int]
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM every child, wait, SIGKILL what is left."""
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in self.children.values():
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()

    def exited(self) -> list[str]:
        return [name for name, child in self.children.items() if child.poll() is not None]


def start_cluster(
    market_path: Path,
    market: Market,
    ports: Mapping[str, int],
    *,
    latency_scale: float,
    seed: int,
    ready_timeout: float = 30.0,
) -> Cluster:
    """Bind, spawn and wait for ``ready`` from every child; on any failure stop them all."""
    started_at = time.time()
    sockets = {name: bind(port) for name, port in ports.items()}
    cluster = Cluster({name: sock.getsockname()[1] for name, sock in sockets.items()})
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    try:
        for provider in market.providers:
            sock = sockets[provider.name]
            command = [
                sys.executable,
                "-m",
                "simulator.server",
                "--market",
                str(market_path.resolve()),
                "--provider",
                provider.name,
                "--fd",
                str(sock.fileno()),
                "--latency-scale",
                repr(latency_scale),
                "--seed",
                str(seed),
                "--started-at",
                repr(started_at),
            ]
            cluster.children[provider.name] = subprocess.Popen(
                command,
                pass_fds=(sock.fileno(),),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
        _wait_ready(cluster, ready_timeout)
    except BaseException:
        cluster.stop()
        raise
    finally:
        for sock in sockets.values():
            sock.close()  # the children hold their own copies
    return cluster


def _wait_ready(cluster: Cluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    waiting = dict(cluster.children)
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LaunchError(f"providers not ready after {timeout:g}s: {', '.join(waiting)}")
        streams = {child.stdout: name for name, child in waiting.items() if child.stdout}
        readable, _, _ = select.select(list(streams), [], [], min(remaining, 0.5))
        for stream in readable:
            name = streams[stream]
            line = stream.readline()
            if line.strip() == b"ready":
                del waiting[name]
            elif not line:
                code = cluster.children[name].wait()
                raise LaunchError(f"provider {name} exited with status {code} before ready")


def write_ready_file(path: Path, ports: Mapping[str, int]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(dict(ports), indent=2) + "\n")
    temporary.replace(path)


@contextlib.contextmanager
def running_simulator(
    market_path: Path | str,
    *,
    latency_scale: float = 0.0,
    seed: int = 0,
    timeout: float = 30.0,
    extra_args: tuple[str, ...] = (),
) -> Iterator[dict[str, int]]:
    """Run ``manage.py providersim`` on free ports for a test; yields ``{provider: port}``.

    Every provider gets port 0 (a free port); the process group is stopped on exit.
    """
    from simulator.model import parse_market_text  # local: keep this module cheap to import

    market = parse_market_text(Path(market_path).read_text())
    ports = ",".join(f"{provider.name}=0" for provider in market.providers)
    ready = Path(market_path).with_name(f".providersim-{os.getpid()}-{time.monotonic_ns()}.json")
    command = [
        sys.executable,
        str(PROJECT_ROOT / "manage.py"),
        "providersim",
        "--market",
        str(market_path),
        "--ports",
        ports,
        "--ready-file",
        str(ready),
        "--latency-scale",
        repr(latency_scale),
        "--seed",
        str(seed),
        *extra_args,
    ]
    process = subprocess.Popen(command, cwd=PROJECT_ROOT)
    try:
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if process.poll() is not None:
                raise LaunchError(f"providersim exited with status {process.returncode}")
            if time.monotonic() > deadline:
                raise LaunchError(f"providersim not ready after {timeout:g}s")
            time.sleep(0.02)
        yield {name: int(port) for name, port in json.loads(ready.read_text()).items()}
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        ready.unlink(missing_ok=True)
