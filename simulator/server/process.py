"""One provider process: serve a provider on an inherited listening socket until told to stop.

Started by :mod:`simulator.launcher` as ``python -m simulator.server``. It prints ``ready`` on
stdout once it accepts connections and stops on SIGTERM, SIGINT or when its stdin closes (the
parent died), so no orphan keeps a port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
from pathlib import Path

import uvloop

from simulator.model import ProviderBehaviour, ProviderSpec, parse_market_text
from simulator.server.app import ProviderApp
from simulator.server.http import Connection


def behaviour_rngs(seed: int, provider: str) -> tuple[random.Random, random.Random]:
    """The behaviour's RNG and the wire's (ids, text): separate, so the behaviour's sequence of
    draws is the same whatever the wire does — as in the switchback experiment."""
    return random.Random(f"{seed}:{provider}:behaviour"), random.Random(f"{seed}:{provider}:wire")


async def serve(
    spec: ProviderSpec,
    sock: socket.socket,
    *,
    latency_scale: float,
    seed: int,
    started_at: float,
    watch_stdin: bool = True,
) -> None:
    loop = asyncio.get_running_loop()
    rng, wire_rng = behaviour_rngs(seed, spec.name)
    app = ProviderApp(
        ProviderBehaviour(spec, rng, started_at), wire_rng, latency_scale=latency_scale
    )
    server = await loop.create_server(lambda: Connection(app), sock=sock, backlog=4096)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if watch_stdin:
        loop.add_reader(sys.stdin.fileno(), _on_stdin, stop)
    print("ready", flush=True)
    await stop.wait()
    server.close()
    app.cancel_streams()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(server.wait_closed(), timeout=1.0)


def _on_stdin(stop: asyncio.Event) -> None:
    if not os.read(sys.stdin.fileno(), 4096):  # EOF: the parent is gone
        asyncio.get_running_loop().remove_reader(sys.stdin.fileno())
        stop.set()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simulator.server")
    parser.add_argument("--market", required=True, type=Path)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--fd", required=True, type=int, help="inherited listening socket")
    parser.add_argument("--latency-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--started-at", type=float, required=True)
    args = parser.parse_args(argv)
    spec = parse_market_text(args.market.read_text()).provider(args.provider)
    sock = socket.socket(fileno=args.fd)
    uvloop.run(
        serve(
            spec,
            sock,
            latency_scale=args.latency_scale,
            seed=args.seed,
            started_at=args.started_at,
        )
    )
