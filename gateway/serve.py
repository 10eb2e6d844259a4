"""Run the gateway: uvicorn in N worker processes, each listening on a socket of its own.

    python -m gateway.serve [--host 127.0.0.1] [--port 8000] [--workers 2]

``uvicorn --workers N`` shares one listening socket between its workers. Each burst of new
connections goes to the first worker that wakes up: it accepts every queued connection, and
keeps each one for as long as the client keeps it alive. A client that holds a pool of
keep-alive connections, such as a load balancer, an SDK or a benchmark, can so load one worker
and leave the others idle. In the side-by-side benchmark that cut throughput at 64 connections
in half (bench/results/redis.md, tenth session). Here each worker binds the port itself with
``SO_REUSEPORT``, and the kernel spreads new connections over the workers' sockets by their
addresses.

This module is a small supervisor in place of uvicorn's: it starts the workers, starts a new one
when one dies, on SIGHUP replaces every worker by a new one (as uvicorn's and gunicorn's
supervisors do: new code and settings, with no moment when no worker listens), and on SIGTERM
or SIGINT stops them all (each finishes its requests as uvicorn does) and exits. Each worker
runs ``uvicorn.Server`` with the settings ``scripts/demo`` always used: uvloop,
``gateway.server:HttpProtocol``, no access log.

Each worker runs the quota and routing cores compiled by mypyc when a build for the exact
sources exists (``python -m common.compiled_cores`` makes one, once per version of the cores):
a request then executes ~4 % fewer instructions. ``SWITCHYARD_CORES`` chooses: ``auto`` (the
default: the build if there is one), ``compiled`` (make it first if there is none, ~1 minute),
``pure`` (never). The first log line says which the workers run, and why.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from multiprocessing.context import SpawnProcess
from types import FrameType

import uvicorn

from common import compiled_cores

APP = "switchyard.asgi:application"
RESPAWN_PAUSE = 1.0  # a worker that dies at once is started again at most once a second
STOP_GRACE = 30.0  # seconds a worker has to finish its requests after SIGTERM
STARTUP_FAILURE = 3  # uvicorn's exit status when it cannot start
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
CORES_ENV = "SWITCHYARD_CORES"
CORES_CHOICES = ("auto", "compiled", "pure")

log = logging.getLogger("switchyard.serve")


def config(app: str, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="gateway.server:HttpProtocol",  # uvicorn's own 400s in the error envelope
        access_log=False,
    )


def own_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on the shared port that only this process accepts from."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def port_taken(host: str, port: int) -> bool:
    """Whether a server already listens on the port. Sockets with ``SO_REUSEPORT`` share it with
    any other of the same user, so a second gateway would take half of the first's connections
    without a word: refused here, as uvicorn refuses a port in use."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not TIME_WAIT's ports
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def cores_build(choice: str) -> tuple[str | None, str]:
    """The mypyc build the workers load (None: the cores run as Python), and a line saying
    which and why. Resolved when a worker starts, so workers started after new code (SIGHUP)
    load the build for the new sources or none, never a stale one."""
    if choice == "pure":
        return None, f"cores run as pure Python ({CORES_ENV}=pure)"
    if choice == "compiled":
        return compiled_cores.cores(pure=False)
    found = compiled_cores.cached(compiled_cores.build_key())
    if found is None:
        return None, (
            "cores run as pure Python: no mypyc build for these sources"
            " (python -m common.compiled_cores makes one)"
        )
    return str(found.path), f"cores compiled by mypyc ({found.path})"


def load_cores(build: str | None) -> None:
    """In a worker, before the application imports the cores: load the build, if any. One that
    cannot be loaded leaves the cores as Python, with a warning."""
    if build is None:
        return
    try:
        compiled_cores.install(build)
    except compiled_cores.InstallError as error:
        log.warning("cores run as pure Python: %s", error)


def end_with(supervisor: int) -> None:
    """This worker gets SIGTERM when its supervisor dies, however it died (SIGKILL, the OOM
    killer). Else it would go on serving the port with no one to replace or stop it, and a
    gateway started again would refuse the port as taken (``port_taken``). Linux only."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def worker(settings: uvicorn.Config, cores: str | None, supervisor: int) -> None:
    """One worker process: its own socket, then uvicorn's server until told to stop."""
    end_with(supervisor)
    load_cores(cores)
    settings.configure_logging()
    sock = own_socket(settings.host, settings.port, settings.backlog)
    uvicorn.Server(settings).run(sockets=[sock])


class Supervisor:
    """Keeps ``count`` workers running until told to stop."""

    def __init__(self, settings: uvicorn.Config, count: int, cores: str = "auto") -> None:
        self.settings = settings
        self.count = count
        self.cores = cores
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[SpawnProcess] = []
        self.stopping = False
        self.restarting = False

    def build_cores(self) -> None:
        """With ``compiled``: make the build for the current sources, when starting and on each
        reload. A worker replaced after a crash only looks for one: a build that fails is not
        tried again at every start."""
        if self.cores == "compiled":
            log.info(cores_build("compiled")[1])

    def start(self) -> SpawnProcess:
        build, which = cores_build("auto" if self.cores == "compiled" else self.cores)
        process = self.context.Process(
            target=worker, args=(self.settings, build, os.getpid()), name="worker"
        )
        process.start()
        log.info("started worker %s: %s", process.pid, which)
        return process

    def stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def restart(self, signum: int, frame: FrameType | None) -> None:
        self.restarting = True

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(signal.SIGHUP, self.restart)
        self.build_cores()
        self.workers = [self.start() for _ in range(self.count)]
        while not self.stopping:
            time.sleep(RESPAWN_PAUSE)
            if self.restarting and not self.stopping:
                self.restarting = False
                self.replace_all()
            for i, process in enumerate(self.workers):
                if not self.stopping and not process.is_alive():
                    log.warning("worker %s ended (exit code %s)", process.pid, process.exitcode)
                    self.workers[i] = self.start()
        self.end(self.workers)

    def replace_all(self) -> None:
        """New workers first, listening beside the old ones; then the old ones end, each after
        finishing its requests."""
        self.build_cores()
        old, self.workers = self.workers, [self.start() for _ in range(self.count)]
        log.info("replacing workers %s", ", ".join(str(p.pid) for p in old))
        self.end(old)

    @staticmethod
    def end(processes: list[SpawnProcess]) -> None:
        for process in processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: uvicorn finishes the requests under way
        deadline = time.monotonic() + STOP_GRACE
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--app", default=APP, help="the ASGI application's import path")
    parser.add_argument(
        "--cores",
        choices=CORES_CHOICES,
        default=os.environ.get(CORES_ENV, "auto"),
        help=f"run the cores compiled by mypyc (default: ${CORES_ENV}, else auto)",
    )
    args = parser.parse_args(argv)
    if args.cores not in CORES_CHOICES:  # argparse does not check a default
        parser.error(f"{CORES_ENV}: one of {', '.join(CORES_CHOICES)}, not {args.cores!r}")
    settings = config(args.app, args.host, args.port)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s: %(message)s")
    if args.workers == 1:  # uvicorn serves in this process, as uvicorn alone does
        build, which = cores_build(args.cores)
        log.info(which)
        load_cores(build)
        uvicorn.Server(settings).run()
        return
    if port_taken(args.host, args.port):
        log.error("%s:%s is in use by another server", args.host, args.port)
        sys.exit(STARTUP_FAILURE)
    Supervisor(settings, args.workers, args.cores).run()


if __name__ == "__main__":
    main()
