"""The shared upstream client keeps no cookies (gateway/upstream.py): one client carries every
tenant's requests to a provider, so a cookie one answer set must not ride along with the next."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from aiohttp import web

from gateway import upstream
from gateway.dispatch import attempt_send
from gateway.doors.chat import CHAT
from tests.gateway.test_dispatch import ENDPOINT

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


async def two_calls_to_a_provider_that_sets_a_cookie() -> tuple[list[str | None], int]:
    seen: list[str | None] = []

    async def completions(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        response = web.json_response(COMPLETION)
        response.set_cookie("__cf_bm", "tenant-a-session", path="/")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base_url = f"http://127.0.0.1:{port}/v1"
    endpoint = dataclasses.replace(
        ENDPOINT, provider=dataclasses.replace(ENDPOINT.provider, base_url=base_url)
    )
    body = json.dumps({"model": "acme/chat", "messages": [{"role": "user", "content": "hi"}]})
    try:
        for n in range(2):
            attempt = await attempt_send(
                endpoint, CHAT.parse(body.encode(), {}), response_id=f"gen-{n}", model="m",
                created=1,
            )  # fmt: skip
            assert attempt.ok, attempt.failure
        kept = len(upstream.session_for(base_url).cookie_jar)
    finally:
        await upstream.clients_close()
        await runner.cleanup()
    return seen, kept


def test_it_sends_no_cookie_a_provider_set_on_an_earlier_answer():
    cookie_headers, cookies_kept = asyncio.run(two_calls_to_a_provider_that_sets_a_cookie())
    assert cookie_headers == [None, None]
    assert cookies_kept == 0
