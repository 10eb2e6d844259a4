"""The load of the CPU and Redis benchmarks (bench/cpu_per_request.py ``drive``): two cases
compared over the same connections, and arrivals spread rather than bunched."""

from __future__ import annotations

import asyncio
import itertools
import time

from aiohttp import web

from bench import cpu_per_request

CONNECTIONS = 4


class Upstream:
    """A loopback server that notes which client port each request came from, and when."""

    def __init__(self) -> None:
        self.peers: list[int] = []
        self.arrived: list[float] = []

    async def answer(self, request: web.Request) -> web.Response:
        self.peers.append(request.transport.get_extra_info("peername")[1])
        self.arrived.append(time.monotonic())
        await request.read()
        return web.json_response({"ok": True})

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.answer)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def test_two_drives_over_one_session_are_served_over_the_same_connections() -> None:
    """The server's workers are given connections, not requests: the 0.5 s case and its paced
    twin compare the same workers only if they share connections."""

    async def scenario() -> tuple[set[int], set[int]]:
        upstream = Upstream()
        async with upstream as url, cpu_per_request.session(CONNECTIONS) as over:
            await cpu_per_request.drive(url, b"{}", 20, CONNECTIONS, over=over)
            first = set(upstream.peers)
            upstream.peers.clear()
            await cpu_per_request.drive(url, b"{}", 20, CONNECTIONS, think=0.01, over=over)
            return first, set(upstream.peers)

    first, second = asyncio.run(scenario())
    assert len(first) == CONNECTIONS
    assert second == first


def test_drives_of_their_own_open_connections_of_their_own() -> None:
    async def scenario() -> tuple[set[int], set[int]]:
        upstream = Upstream()
        async with upstream as url:
            await cpu_per_request.drive(url, b"{}", 8, CONNECTIONS)
            first = set(upstream.peers)
            upstream.peers.clear()
            await cpu_per_request.drive(url, b"{}", 8, CONNECTIONS)
            return first, set(upstream.peers)

    first, second = asyncio.run(scenario())
    assert not first & second


def test_staggered_connections_send_their_first_requests_spread_over_the_stagger() -> None:
    """Connections that start together stay together when each waits as long after each
    answer: their requests arrive in bunches that share the server's wake-ups."""

    async def first_arrivals(stagger: float) -> list[float]:
        upstream = Upstream()
        async with upstream as url:
            # one request a connection: each waits longer after its answer than the stagger
            await cpu_per_request.drive(
                url, b"{}", CONNECTIONS, CONNECTIONS, think=0.5, stagger=stagger
            )
        return sorted(upstream.arrived)

    spread = asyncio.run(first_arrivals(0.4))
    gaps = [later - earlier for earlier, later in itertools.pairwise(spread)]
    assert min(gaps) >= 0.4 / CONNECTIONS * 0.8
    bunched = asyncio.run(first_arrivals(0.0))
    assert bunched[-1] - bunched[0] < 0.4 / CONNECTIONS
