"""A small HTTP/1.1 server on asyncio + httptools, built for one job: answering fast.

A connection parses requests with httptools and hands each, in order, to the handler as an
:class:`Exchange`. The handler answers synchronously (``respond``), later (a timer), or as a
chunked stream (``start_stream`` / ``write`` / ``end_stream``); a client that hangs up calls the
exchange's ``on_disconnect`` so the simulator can stop generating and free the slot. Keep-alive
and pipelining are supported; bodies may be chunked. No TLS, no HTTP/2: loopback only.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import httptools

Headers = list[tuple[str, str]]
Handler = Callable[["Exchange"], None]

_REASONS = {status.value: status.phrase for status in HTTPStatus}
_REASONS[529] = "Site Overloaded"
_STATUS_LINES: dict[int, bytes] = {}
MAX_BODY = 32 * 1024 * 1024
log = logging.getLogger("simulator.http")


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n".encode("latin-1")
        _STATUS_LINES[status] = line
    return line


class Request:
    __slots__ = ("body", "headers", "keep_alive", "method", "path", "query")

    def __init__(
        self,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        keep_alive: bool,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers  # lower-cased names
        self.body = body
        self.keep_alive = keep_alive


class Exchange:
    """One request and the means to answer it exactly once."""

    __slots__ = ("_conn", "done", "on_disconnect", "request", "streaming")

    def __init__(self, request: Request, conn: Connection) -> None:
        self.request = request
        self._conn = conn
        self.done = False
        self.streaming = False
        self.on_disconnect: Callable[[], None] | None = None

    @property
    def closed(self) -> bool:
        return self._conn.closed

    def respond(
        self, status: int, headers: Headers, body: bytes, content_type: str = "application/json"
    ) -> None:
        if self.done:
            return
        self.done = True
        conn = self._conn
        if not conn.closed:
            head = [_status_line(status)]
            head.extend(f"{name}: {value}\r\n".encode("latin-1") for name, value in headers)
            head.append(f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n".encode())
            if not self.request.keep_alive:
                head.append(b"connection: close\r\n")
            head.append(b"\r\n")
            head.append(body)
            conn.transport.write(b"".join(head))
        conn.exchange_done(self)

    def start_stream(
        self, status: int, headers: Headers, content_type: str = "text/event-stream; charset=utf-8"
    ) -> None:
        self.streaming = True
        if self._conn.closed:
            return
        head = [_status_line(status)]
        head.extend(f"{name}: {value}\r\n".encode("latin-1") for name, value in headers)
        head.append(f"content-type: {content_type}\r\ntransfer-encoding: chunked\r\n".encode())
        head.append(b"cache-control: no-cache\r\n")
        if not self.request.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        self._conn.transport.write(b"".join(head))

    def write(self, data: bytes) -> None:
        """Send one chunk of a started stream (empty data is skipped: it would end the body)."""
        if data and not self._conn.closed:
            self._conn.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def end_stream(self, last: bytes = b"") -> None:
        if self.done:
            return
        self.done = True
        if not self._conn.closed:
            if last:
                self._conn.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(last), last))
            else:
                self._conn.transport.write(b"0\r\n\r\n")
        self._conn.exchange_done(self)

    async def drain(self) -> None:
        """Wait while the client is not reading (transport buffer above its high-water mark)."""
        await self._conn.drain()


class Connection(asyncio.Protocol):
    """One client connection: parse, queue, dispatch one exchange at a time."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.current: Exchange | None = None
        self.pending: deque[Request] = deque()
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._body_size = 0
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, b'{"error": "upgrades are not supported"}')
        except httptools.HttpParserError:
            self._fail(400, b'{"error": "malformed HTTP request"}')

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pending.clear()
        current, self.current = self.current, None
        if current is not None and not current.done and current.on_disconnect is not None:
            current.on_disconnect()
        self._wake_drainers()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drainers()

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        # curl sends larger bodies only after "100 Continue" (or a 1 s pause without one).
        if self._headers.get("expect", "").lower() == "100-continue" and not self.closed:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > MAX_BODY:
            raise httptools.HttpParserError("body too large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        url = self._url.decode("latin-1")
        path, _, query = url.partition("?")
        request = Request(
            self.parser.get_method().decode("latin-1"),
            path,
            query,
            self._headers,
            b"".join(self._body),
            self.parser.should_keep_alive(),
        )
        self.pending.append(request)
        if self.current is None:
            self._dispatch()

    # -- dispatch ----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        while self.current is None and self.pending and not self.closed:
            exchange = Exchange(self.pending.popleft(), self)
            self.current = exchange
            try:
                self.handler(exchange)
            except Exception:  # a handler bug must answer 500, not hang the client
                log.exception(
                    "handler failed for %s %s", exchange.request.method, exchange.request.path
                )
                if not exchange.done and not exchange.streaming:
                    exchange.respond(500, [], b'{"error": "simulator internal error"}')
                elif not exchange.done:
                    exchange.end_stream()

    def exchange_done(self, exchange: Exchange) -> None:
        if self.current is not exchange:
            return
        self.current = None
        if not exchange.request.keep_alive:
            self.closed = True
            self.transport.close()
            return
        if self.pending:
            self._dispatch()

    def _fail(self, status: int, body: bytes) -> None:
        if not self.closed:
            self.transport.write(
                _status_line(status)
                + b"content-type: application/json\r\nconnection: close\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            self.closed = True
            self.transport.close()

    async def drain(self) -> None:
        if not self._paused or self.closed:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def _wake_drainers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
