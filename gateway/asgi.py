"""ASGI entry point: ``uvicorn gateway.asgi:application``.

Two Django handlers share one URLconf:
- the proxy API (``/v1/…``) runs without the middleware chain. Django's ``MiddlewareMixin``
  runs each middleware in a thread when serving async views, which would cost the hot path
  more than the whole proxy; the API needs none of sessions, CSRF or messages.
- everything else (admin, ops pages) runs the full middleware stack.
Oversized bodies are refused here from their Content-Length, before Django buffers them.
"""

from __future__ import annotations

import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
django.setup(set_prefix=False)

import orjson  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402

from gateway import upstream  # noqa: E402
from gateway.errors import BodyTooLarge  # noqa: E402

Scope = dict[str, Any]
PROXY_PREFIX = "/v1/"


class ProxyHandler(ASGIHandler):
    """Django's ASGI handler with an empty middleware chain."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        get_response = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(get_response)


proxy_handler = ProxyHandler()
site_handler = ASGIHandler()


async def application(scope: Scope, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
    elif scope["type"] == "http" and scope["path"].startswith(PROXY_PREFIX):
        if _declared_length(scope) > settings.MAX_REQUEST_BODY_BYTES:
            await _refuse_too_large(send)
        else:
            await proxy_handler(scope, receive, send)
    else:
        await site_handler(scope, receive, send)


def _declared_length(scope: Scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


async def _refuse_too_large(send: Any) -> None:
    error = BodyTooLarge(
        f"Request body is larger than the limit of {settings.MAX_REQUEST_BODY_BYTES} bytes."
    )
    body = orjson.dumps(error.envelope())
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await upstream.clients_close()
            await send({"type": "lifespan.shutdown.complete"})
            return
