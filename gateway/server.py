"""uvicorn's HTTP protocol, with these changes (``gateway.serve`` runs uvicorn with it;
elsewhere, ``--http gateway.server:HttpProtocol``):

- its own refusals in Switchyard's error envelope (SPEC H1). A request line or header the
  parser cannot read (control bytes, a bad method token) never reaches the ASGI application:
  uvicorn answers it itself, ``400 text/plain "Invalid HTTP request received."``. This answers
  the same 400 as JSON in the envelope.
- a response whose length is known goes out in one write, status line and headers with its
  body. uvicorn writes the headers the moment the application starts the response and the body
  in a second write: two system calls per answer, and on loopback each wakes the client. A
  streamed answer (no Content-Length) still sends its headers at once.
- a lost connection is told to the request's handler at once (``Disconnect``), so the handler
  needs no task of its own waiting for ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import orjson
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)


class HttpProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        # Imported here: uvicorn loads this protocol before the application, and the errors
        # bring in Django REST framework, which would import what switchyard.asgi keeps out.
        from gateway.errors import InvalidRequest

        error = InvalidRequest(msg, code="invalid_http_request")
        body = orjson.dumps(error.envelope())
        content = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        # The cycle's ASGI task has not run yet: it will call this send and read this scope.
        headers_with_body(self.cycle)
        _extensions(self.cycle)[DISCONNECT] = Disconnect()

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # lost before its response was complete
            _extensions(cycle)[DISCONNECT].lose()


DISCONNECT = "switchyard.disconnect"


def _extensions(cycle: RequestResponseCycle) -> dict[str, Any]:
    extensions: dict[str, Any] = cast(dict[str, Any], cycle.scope).setdefault("extensions", {})
    return extensions


class Disconnect:
    """A request's connection lost (the ASGI scope's ``extensions`` carry it under
    ``DISCONNECT``): the task answering the request, if it asked, is cancelled then.

    Why: Django's ASGI handler, and so the proxy's before it, starts a second task per request
    only to wait for ``http.disconnect`` and cancel the first, and waits on both: at 64
    connections that cost ~7 % of a worker's CPU per request (bench/results/gateway_cpu.md).
    The protocol knows the moment the connection goes; it now says so directly."""

    __slots__ = ("cancelled", "lost", "task")

    def __init__(self) -> None:
        self.lost = False
        self.task: asyncio.Task[Any] | None = None
        self.cancelled = False

    def lose(self) -> None:
        self.lost = True
        if self.task is not None:
            self.task.cancel()
            self.task, self.cancelled = None, True


class HeldWrite:
    """The cycle's transport, but a write made while ``hold`` is set is kept and goes out
    with the next one."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.hold = False
        self.held = b""

    def write(self, data: bytes) -> None:
        if self.hold:
            self.held, self.hold = data, False
            return
        if self.held:
            data, self.held = self.held + data, b""
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def headers_with_body(cycle: RequestResponseCycle) -> None:
    """The status line and headers of a response with a Content-Length (not to a HEAD, whose
    body uvicorn never writes) wait for its body's first write."""
    held = HeldWrite(cycle.transport)
    cycle.transport = held  # type: ignore[assignment]
    send = cycle.send
    head = cycle.scope["method"] == "HEAD"

    async def send_joined(message: Any) -> None:
        if (
            not head
            and message["type"] == "http.response.start"
            and not cycle.response_started
            and any(name.lower() == b"content-length" for name, _ in message.get("headers", ()))
        ):
            held.hold = True
            try:
                await send(message)
            finally:
                held.hold = False
            return
        await send(message)

    cycle.send = send_joined  # type: ignore[method-assign]
