"""The ASGI application (served as ``uvicorn switchyard.asgi:application``).

Two Django handlers share one URLconf:
- the proxy API (``/v1/…``) runs on the event loop only. Django's own ASGI handler starts a
  thread per request (``ThreadSensitiveContext`` plus sync signal receivers) and runs each
  ``MiddlewareMixin`` middleware in a thread; measured here, that capped one worker at about
  270 requests/s at 16 connections. The API needs none of sessions, CSRF or messages, and holds
  no database connection in the loop's thread, so ``ProxyHandler`` drops the middleware chain
  and the request signals (below) and closes the response inline.
- the health probes (``gateway.probes``) answer before either handler: no Django request at all.
- static files (``/static/…``, the admin's CSS and JavaScript) are answered by ServeStatic
  (WhiteNoise's ASGI fork) from what ``collectstatic`` gathered, without entering Django.
- everything else (admin, ops pages) runs Django's handler with the full middleware stack.
Oversized bodies are refused here from their Content-Length, before Django buffers them.
"""

from __future__ import annotations

import asyncio
import gc
import io
import os
import tempfile
from collections.abc import Coroutine
from contextlib import suppress
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchyard.settings")
django.setup(set_prefix=False)

import orjson  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.exceptions import RequestAborted  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402
from django.http import HttpRequest  # noqa: E402
from django.urls import ResolverMatch, URLResolver, get_resolver, set_script_prefix  # noqa: E402
from servestatic import ServeStaticASGI  # noqa: E402

from gateway import ledger, upstream  # noqa: E402
from gateway.errors import BodyTooLarge  # noqa: E402
from gateway.probes import PATHS as PROBE_PATHS  # noqa: E402
from gateway.probes import probe  # noqa: E402
from gateway.server import DISCONNECT, Disconnect  # noqa: E402
from gateway.taskdump import tasks_dump_install  # noqa: E402
from gateway.views import is_api_path  # noqa: E402
from quotas import recovery  # noqa: E402
from quotas.broker import broker_close  # noqa: E402

Scope = dict[str, Any]
STATIC_PREFIX = "/" + settings.STATIC_URL.strip("/") + "/"


class ProxyHandler(ASGIHandler):
    """Django's ASGI handler without middleware and without a thread per request."""

    def __init__(self) -> None:
        super().__init__()
        self._resolved: dict[str, tuple[URLResolver, ResolverMatch]] = {}

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        get_response = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(get_response)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        await self.handle(scope, receive, send)

    def resolve_request(self, request: HttpRequest) -> ResolverMatch:
        """Django's, remembered for a path that names its view whole (no argument in it: the
        API's fixed endpoints, a handful), so the URLconf is not walked for each request."""
        resolver = get_resolver()
        known = self._resolved.get(request.path_info)
        if known is not None and known[0] is resolver:
            request.resolver_match = known[1]
            return known[1]
        match: ResolverMatch = super().resolve_request(request)
        if not match.args and not match.kwargs:
            self._resolved[request.path_info] = (resolver, match)
        return match

    async def send_response(self, response: Any, send: Any) -> None:
        """Django's, for a whole answer without cookies (every proxy answer but a stream): its
        headers encoded in one pass over Django's store (``headers_add`` writes the proxy's
        own there), where Django's walks them through the mapping's views, ~3 calls a header;
        its body in one message, which the protocol writes with the headers."""
        if response.streaming or response.cookies:
            await super().send_response(response, send)
            return
        headers = [
            (name.encode("ascii"), value.encode("latin-1"))
            for name, value in response.headers._store.values()
        ]
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": response.content})

    async def read_body(self, receive: Any) -> Any:
        """A body that came in one message (every proxy request but the largest) is read from
        memory as it is; a longer one goes to Django's spooled file as before (~3 us saved)."""
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestAborted()
        if message.get("more_body", False):
            return await self._read_body_spooled(message, receive)
        return io.BytesIO(message.get("body", b""))

    async def _read_body_spooled(self, first: dict[str, Any], receive: Any) -> Any:
        body_file = tempfile.SpooledTemporaryFile(  # noqa: SIM115 - the caller closes it
            max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b"
        )
        message = first
        while True:
            if message["type"] == "http.disconnect":
                body_file.close()
                raise RequestAborted()
            body_file.write(message.get("body", b""))
            if not message.get("more_body", False):
                break
            message = await receive()
        body_file.seek(0)
        return body_file

    async def handle(self, scope: Scope, receive: Any, send: Any) -> None:
        # Django's ASGIHandler.handle, minus the thread hops (see the module docstring), and
        # minus request_started / request_finished (~24 us a request): their receivers are
        # Django's own and have nothing to do on the loop's thread. close_old_connections: it
        # holds no database connection (the proxy's queries run in asgiref's thread and check
        # their connection there, common/db.py); reset_queries: DEBUG's query log of those
        # connections; close_caches: the proxy uses no Django cache; reset_urlconf: it sets no
        # per-request URLconf. The site handler still sends them for the admin and ops pages.
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(scope.get("root_path", "") or "/")
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            error_response.close()
            return

        async def process_request() -> Any:
            response = await self.run_get_response(request)
            if not response.streaming and not response.has_header("Content-Length"):
                # As CommonMiddleware does on the full stack: the answer then goes out in one
                # write (gateway/server.py), not as chunks after a separate write of its headers.
                response.headers["Content-Length"] = str(len(response.content))
            with suppress(asyncio.CancelledError):  # the client left during the response
                await self.send_response(response, send)
            return response

        # A client that disconnects cancels the view, and with it the upstream call.
        disconnect = scope.get("extensions", {}).get(DISCONNECT)
        if disconnect is None:  # another server than gateway.server's protocol
            response = await self._answer_listening(process_request(), receive)
        else:
            response = await _answer_until_lost(process_request(), disconnect)
        if response is not None:
            await _stream_close(response)
            _response_close(response)
        body_file.close()

    async def _answer_listening(self, answer: Coroutine[Any, Any, Any], receive: Any) -> Any:
        """Django's way: a task to answer and one waiting for ``http.disconnect``; the
        answer, or None if the client left first."""
        disconnect = asyncio.create_task(self.listen_for_disconnect(receive))
        processing = asyncio.create_task(answer)
        await asyncio.wait([disconnect, processing], return_when=asyncio.FIRST_COMPLETED)
        for task in (disconnect, processing):
            if not task.done():
                task.cancel()
            with suppress(asyncio.CancelledError, RequestAborted):
                await task
        return None if processing.cancelled() else processing.result()


async def _answer_until_lost(answer: Coroutine[Any, Any, Any], disconnect: Disconnect) -> Any:
    """The answer, in this task, which a lost connection cancels (``gateway.server``); None if
    the client left first. A cancel the answer took in (a stream cut while a chunk was being
    sent: see ``process_request``) is taken back here, so later waits with a timeout (the
    stream's settle) count this task's cancels right."""
    if disconnect.lost:
        answer.close()
        return None
    task = asyncio.current_task()
    assert task is not None  # an ASGI server runs each request in a task
    disconnect.task = task
    try:
        return await answer
    except asyncio.CancelledError:
        if not disconnect.cancelled:
            raise  # the server's own (shutting down)
        return None
    finally:
        disconnect.task = None
        if disconnect.cancelled:
            task.uncancel()


async def _stream_close(response: Any) -> None:
    """Close a streamed answer's own body. Django's ``send_response`` closes its wrapper around
    an async body, not the body: a stream cut off while a chunk was being sent kept its
    generator — and with it the request's settlement, ledger row and Idempotency-Key — until
    the garbage collector found it (the fuzz suite's keys left claimed)."""
    body = getattr(response, "_iterator", None) if getattr(response, "is_async", False) else None
    if body is not None and hasattr(body, "aclose"):
        await body.aclose()


def _response_close(response: Any) -> None:
    """``HttpResponseBase.close`` without its request_finished signal (see ``handle``)."""
    for closer in response._resource_closers:
        with suppress(Exception):  # as Django's close: a closer's failure is not the answer's
            closer()
    response._resource_closers.clear()
    response.closed = True


proxy_handler = ProxyHandler()
site_handler = ASGIHandler()
# Hashed names (base.96c479cedf7a.css) are cached for good, others for a minute; a path it does
# not hold goes on to Django (its 404 page).
static_handler = ServeStaticASGI(site_handler, root=settings.STATIC_ROOT, prefix=STATIC_PREFIX)


async def application(scope: Scope, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
    elif scope["type"] == "http" and is_api_path(scope["path"]):
        if _declared_length(scope) > settings.MAX_REQUEST_BODY_BYTES:
            await _refuse_too_large(send)
        else:
            await proxy_handler(scope, receive, send)
    elif scope["type"] == "http" and scope["path"] in PROBE_PATHS:
        await probe(scope, send)
    elif scope["type"] == "http" and scope["path"].startswith(STATIC_PREFIX):
        await static_handler(scope, receive, send)
    else:
        await site_handler(scope, receive, send)


# Tracked objects made, less those freed, that start a collection of the youngest generation:
# 700 by default, which the objects of the requests in flight pass many times a second. Each
# such collection walks them and moves the living on, to be walked again by the older
# generations' collections. At 20,000 they run ~28 times less often: ~1.2 % fewer instructions
# a proxied request, ~4 MiB more peak RSS per worker (bench/results/gateway_cpu.md).
YOUNG_COLLECTION_THRESHOLD = 20_000


def _startup_heap_freeze() -> None:
    """Leave what the worker built to start (~117,000 objects: modules, classes, Django's
    registries) out of every later garbage collection (``gc.freeze``). A full collection walks
    every tracked object: ~70 ms each in a bench worker holding ~130,000 (gc callbacks, load
    ~8), about once per 1,500 requests, with every request in flight on the worker waiting;
    frozen, it walks only what was made since. Garbage from the start is collected first, so
    nothing unreachable is frozen; objects made later are collected as before, the youngest
    less often (``YOUNG_COLLECTION_THRESHOLD``)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)


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
            await recovery.members_join("gateway")  # before serving: a new Redis is known new
            tasks_dump_install()
            _startup_heap_freeze()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await broker_close()  # before the ledger's drain: an allowance's records with it
            await recovery.members_leave()
            await ledger.ledger_drain()
            await upstream.clients_close()
            await send({"type": "lifespan.shutdown.complete"})
            return
