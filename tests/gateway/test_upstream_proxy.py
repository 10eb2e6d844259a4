"""A provider is reached through the egress proxy the environment names for it (HTTP_PROXY /
HTTPS_PROXY), unless NO_PROXY lists its host or it is on loopback (gateway/upstream.py
``proxy_for``)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import httpx
import pytest

from gateway import upstream
from gateway.dispatch import Attempt, attempt_send
from gateway.doors.chat import CHAT
from tests.gateway.test_dispatch import ENDPOINT
from tests.gateway.test_upstream_cookies import COMPLETION
from tests.loopback_provider import LoopbackProvider

BODY = json.dumps({"model": "acme/chat", "messages": [{"role": "user", "content": "hi"}]})


def answer(body: bytes) -> httpx.Response:
    return httpx.Response(200, json=COMPLETION)


def call(base_url: str) -> Attempt:
    endpoint = dataclasses.replace(
        ENDPOINT, provider=dataclasses.replace(ENDPOINT.provider, base_url=base_url)
    )

    async def once() -> Attempt:
        try:
            request = CHAT.parse(BODY.encode(), {})
            return await attempt_send(endpoint, request, response_id="gen-1", model="m", created=1)
        finally:
            await upstream.clients_close()

    return asyncio.run(once())


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def test_it_reaches_a_provider_through_the_proxy_the_environment_names(environment):
    with LoopbackProvider(answer) as proxy:
        environment.setenv("HTTP_PROXY", proxy.url)
        attempt = call("http://provider.invalid/v1")  # a name no resolver knows: only via the proxy
    assert attempt.ok, attempt.failure
    assert len(proxy.received) == 1


def test_it_goes_straight_to_a_provider_whose_host_no_proxy_lists(environment):
    with LoopbackProvider(answer) as proxy:
        environment.setenv("HTTP_PROXY", proxy.url)
        environment.setenv("NO_PROXY", "provider.invalid")
        attempt = call("http://provider.invalid/v1")  # straight, so unreachable
    assert attempt.error is not None and attempt.error.status == 502
    assert proxy.received == []


def test_it_never_sends_a_provider_on_loopback_through_the_proxy(environment):
    with LoopbackProvider(answer) as provider, LoopbackProvider(answer) as proxy:
        environment.setenv("HTTP_PROXY", proxy.url)  # and no NO_PROXY
        attempt = call(provider.url + "/v1")
    assert attempt.ok, attempt.failure
    assert (len(provider.received), len(proxy.received)) == (1, 0)
