"""The worker's CPU per upstream call, by the two ways ``gateway.upstream`` offers (issue 19
item 2): httpx's API over the provider's pool (``client_for``, what every call went through
before; the provider batch API still does) and aiohttp itself on the same pool
(``session_for``, what completions and embeddings use now, streamed or not). One process,
``--connections`` calls in flight, against the shared harness's fast mock upstream (TTFT 0) on
a free loopback port; CPU is this process's ``time.process_time`` over exactly ``--calls``
calls, so the mock's own work is not in it and a busy machine moves the figure little. The
two ways alternate, ``--rounds`` times.

    .venv/bin/python bench/upstream_client.py [--calls 3000] [--connections 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchyard.settings")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
import orjson  # noqa: E402
import uvloop  # noqa: E402

from bench.cpu_per_request import MESSAGES, harness  # noqa: E402
from gateway import upstream  # noqa: E402

HEADERS = {"authorization": "Bearer sk-mock-upstream", "content-type": "application/json"}
BODY = orjson.dumps({"model": "demo-model", "messages": MESSAGES, "max_tokens": 16})
PATH = "/chat/completions"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def through_httpx(base: str) -> Callable[[], Awaitable[object]]:
    async def call() -> object:
        client = upstream.client_for(base)
        request = client.build_request(
            "POST", upstream.url_for(base, PATH), content=BODY, headers=HEADERS
        )
        response = await client.send(request)
        return response.json()

    return call


def through_aiohttp(base: str) -> Callable[[], Awaitable[object]]:
    async def call() -> object:
        url = upstream.session_url(base, PATH)
        async with upstream.session_for(base).post(url, data=BODY, headers=HEADERS) as response:
            return orjson.loads(await response.read())

    return call


async def cpu_per_call(
    call: Callable[[], Awaitable[object]], calls: int, connections: int
) -> float:
    for _ in range(100):  # connections opened, caches filled
        await call()

    async def one_connection(n: int) -> None:
        for _ in range(n):
            await call()

    started = time.process_time()
    await asyncio.gather(*(one_connection(calls // connections) for _ in range(connections)))
    return (time.process_time() - started) / (calls // connections * connections)


async def rounds(base: str, args: argparse.Namespace) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"httpx over the pool": [], "aiohttp": []}
    for _ in range(args.rounds):
        for name, way in (("httpx over the pool", through_httpx), ("aiohttp", through_aiohttp)):
            found[name].append(await cpu_per_call(way(base), args.calls, args.connections))
    await upstream.clients_close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    mock = subprocess.Popen(
        [sys.executable, str(harness() / "mock_upstream.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        found = uvloop.run(rounds(f"http://127.0.0.1:{port}/v1", args))
    finally:
        mock.terminate()
        mock.wait(timeout=10)
    shape = f"{args.calls} calls, {args.connections} in flight"
    print(f"| way | CPU µs per call, each round ({shape}) |")
    print("|---|---|")
    for name, values in found.items():
        print(f"| {name} | {' / '.join(f'{v * 1e6:.0f}' for v in values)} |")


if __name__ == "__main__":
    main()
