"""The proxy's answers carry many headers of its own (H1); they are written into Django's
response, and sent from it, without Django's per-header work, and come out as Django's would."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.core.handlers.asgi import ASGIHandler
from django.http import BadHeaderError, HttpResponse, StreamingHttpResponse

from gateway.asgi import ProxyHandler
from gateway.responses import headers_add

HEADERS = {
    "x-request-id": "gen-565ac726081b8682f73712492c819296",
    "X-Switchyard-Route": "strategy=routing_cost; winner=mock-b cost=3.85e-05; sticky=no",
    "ratelimit-policy": '"tenant:acme:requests:1m";q=120;w=60;qu="requests"',
    "x-switchyard-bucket": "tenant:Zürich:requests:1m",  # Latin-1, not ASCII: kept by Django
    "x-switchyard-team": "team:Łódź",  # not Latin-1: MIME-encoded by Django
    "x-switchyard-attempts": 1,  # not a string: Django's str()
    "x-empty": "",
}


def django_way(headers: dict[str, Any]) -> HttpResponse:
    response = HttpResponse(b"{}", content_type="application/json")
    for name, value in headers.items():
        response[name] = value
    return response


def test_headers_are_stored_as_django_stores_them() -> None:
    response = HttpResponse(b"{}", content_type="application/json")
    headers_add(response, HEADERS)
    assert list(response.items()) == list(django_way(HEADERS).items())
    assert response["X-Request-ID"] == HEADERS["x-request-id"]  # any case, as Django's
    assert response["x-switchyard-team"].startswith("=?utf-8?")


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-test", "a\r\nSet-Cookie: x=1"), ("x-test", "a\nb"), ("x-test", "tab\there"),
     ("x-tést", "1")],
)  # fmt: skip
def test_a_header_django_would_refuse_or_change_goes_its_way(name: str, value: str) -> None:
    response = HttpResponse(b"{}")
    try:
        expected = django_way({name: value})[name]
    except (BadHeaderError, UnicodeError) as refused:
        with pytest.raises(type(refused)):
            headers_add(response, {name: value})
    else:
        headers_add(response, {name: value})
        assert response[name] == expected


def sent(handler: ASGIHandler, response: HttpResponse) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    asyncio.run(handler.send_response(response, send))
    return messages


def test_the_proxy_handler_sends_an_answer_as_djangos_handler_does() -> None:
    response = HttpResponse(b'{"id": "x"}' * 10_000, status=201, content_type="application/json")
    headers_add(response, HEADERS)
    ours, djangos = sent(ProxyHandler(), response), sent(ASGIHandler(), response)
    assert ours[0] == djangos[0]  # status and headers, in order and in bytes
    assert len(ours) == 2  # the body in one message, where Django's sends 64 KiB chunks
    assert ours[1]["body"] == b"".join(m.get("body", b"") for m in djangos[1:])


def test_an_answer_with_cookies_or_a_stream_is_sent_by_django() -> None:
    with_cookie = HttpResponse(b"{}")
    with_cookie.set_cookie("session", "1")
    assert sent(ProxyHandler(), with_cookie) == sent(ASGIHandler(), with_cookie)

    async def parts() -> Any:
        yield b"data: 1\n\n"

    ours = sent(ProxyHandler(), StreamingHttpResponse(parts()))
    assert [m.get("body") for m in ours] == [None, b"data: 1\n\n", None]
