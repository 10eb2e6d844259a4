"""A provider on a loopback port: a real HTTP server (the standard library's, in a thread of its
own) that answers each request with what ``answer(body)`` returns, and keeps the bodies it
received. For tests of the gateway's side of one upstream call, where the simulator's market
would only get in the way: the call still crosses a socket, as in production.

An answer made from an iterator (``httpx.Response(200, content=parts())``) is streamed: each
part is written as it comes (chunked), so a generator that sleeps between parts paces the
stream, and one that sleeps past the gateway's read timeout stalls it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

import httpx

# Framing is the server's to write (the answer's own length, no chunking).
_FRAMING = {"content-length", "transfer-encoding", "connection"}


class LoopbackProvider:
    def __init__(self, answer: Callable[[bytes], httpx.Response]) -> None:
        self.answer = answer
        self.received: list[bytes] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a provider's API

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                provider.received.append(body)
                response = provider.answer(body)
                try:
                    content = response.content
                except httpx.ResponseNotRead:
                    self.stream(response)
                    return
                self.start(response)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def start(self, response: httpx.Response) -> None:
                """The status line and the answer's own headers (framing is written apart)."""
                self.send_response(response.status_code)
                for name, value in response.headers.items():
                    if name.lower() not in _FRAMING:
                        self.send_header(name, value)

            def stream(self, response: httpx.Response) -> None:
                self.start(response)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for part in response.stream:  # type: ignore[union-attr]
                        if part:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the gateway went away (a cut, a timeout)

            def log_message(self, format: str, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> LoopbackProvider:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def providers_served_by(served: LoopbackProvider, urls: Iterable[str]) -> None:
    """Point the configured providers at ``urls`` (the reference config's) to ``served``,
    each keeping its path (``http://127.0.0.1:9101/v1`` → ``<served.url>/v1``)."""
    from routing.models import Provider

    for url in urls:
        path = urlsplit(url).path
        Provider.objects.filter(base_url=url).update(base_url=served.url + path)
