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
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import signal
import socket
import sys
import time
from multiprocessing.context import SpawnProcess
from types import FrameType

import uvicorn

APP = "switchyard.asgi:application"
RESPAWN_PAUSE = 1.0  # a worker that dies at once is started again at most once a second
STOP_GRACE = 30.0  # seconds a worker has to finish its requests after SIGTERM
STARTUP_FAILURE = 3  # uvicorn's exit status when it cannot start

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


def worker(settings: uvicorn.Config) -> None:
    """One worker process: its own socket, then uvicorn's server until told to stop."""
    settings.configure_logging()
    sock = own_socket(settings.host, settings.port, settings.backlog)
    uvicorn.Server(settings).run(sockets=[sock])


class Supervisor:
    """Keeps ``count`` workers running until told to stop."""

    def __init__(self, settings: uvicorn.Config, count: int) -> None:
        self.settings = settings
        self.count = count
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[SpawnProcess] = []
        self.stopping = False
        self.restarting = False

    def start(self) -> SpawnProcess:
        process = self.context.Process(target=worker, args=(self.settings,), name="worker")
        process.start()
        log.info("started worker %s", process.pid)
        return process

    def stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def restart(self, signum: int, frame: FrameType | None) -> None:
        self.restarting = True

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(signal.SIGHUP, self.restart)
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
    args = parser.parse_args(argv)
    settings = config(args.app, args.host, args.port)
    if args.workers == 1:  # uvicorn serves in this process, as uvicorn alone does
        uvicorn.Server(settings).run()
        return
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s: %(message)s")
    if port_taken(args.host, args.port):
        log.error("%s:%s is in use by another server", args.host, args.port)
        sys.exit(STARTUP_FAILURE)
    Supervisor(settings, args.workers).run()


if __name__ == "__main__":
    main()
