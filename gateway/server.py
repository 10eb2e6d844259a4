"""uvicorn's HTTP protocol with its own refusals in Switchyard's error envelope (SPEC H1).

A request line or header the parser cannot read (control bytes, a bad method token) never
reaches the ASGI application: uvicorn answers it itself, ``400 text/plain "Invalid HTTP request
received."``. This subclass answers the same 400 as JSON in the envelope. Run uvicorn with
``--http gateway.server:HttpProtocol``.
"""

from __future__ import annotations

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.errors import InvalidRequest


class HttpProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
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
