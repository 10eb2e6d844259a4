"""The base of every error a client can see: OpenAI's error envelope plus Switchyard's
``reason`` code. The errors themselves, and the one place that turns one into a response, are
the proxy's (``gateway/errors.py``)."""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    status = 500
    type = "api_error"
    code = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        reason: str | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.reason = reason or (code or self.code)
        self.headers = headers or {}
        if code is not None:
            self.code = code

    def envelope(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "code": self.code,
                "param": self.param,
                "reason": self.reason,
            }
        }
