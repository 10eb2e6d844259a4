"""Every error a client can see, and the one place that turns it into a response.

    GatewayError                      (status, type, code, reason code)
    ├── InvalidRequest                400 invalid_request_error — malformed JSON, wrong types, …
    │   └── UnknownModel              404 model_not_found
    │   └── NotFound                  404 not_found — no such endpoint or record
    ├── MethodNotAllowed              405 method_not_allowed
    ├── IdempotencyConflict           409 idempotency_conflict — that key's request is in flight,
    │                                     or its answer cannot be replayed (a stream)
    ├── IdempotencyKeyReused          422 idempotency_key_reused — that key came with another body
    ├── JobNotCancellable             409 job_not_cancellable — the job runs or has finished
    ├── BodyTooLarge                  413 request_too_large
    ├── AuthenticationFailed          401 invalid_api_key — unknown, revoked and expired alike
    ├── PermissionDenied              403 model_not_allowed — the key may not use this model
    ├── CapacityRefused               429 rate_limit_exceeded — refused, with Retry-After
    ├── UpstreamError                 502 upstream_error — the provider failed or answered garbage
    │   ├── UpstreamUnavailable       502 upstream_unavailable — could not connect
    │   ├── UpstreamTimeout           504 upstream_timeout
    │   ├── UpstreamRateLimited       429 upstream_rate_limited — every provider refused
    │   ├── UpstreamOverloaded        503 upstream_overloaded
    │   └── UpstreamQuotaExhausted    503 upstream_quota_exhausted — the platform's provider
    │                                     account is out of quota or spend (not the caller's rate)
    ├── ServiceUnavailable            503 service_unavailable — Switchyard itself cannot serve
    │   └── BrokerUnavailable         503 broker_unavailable — its rate-limit state (Redis) is away
    └── InternalError                 500 internal_error — a bug (logged with its traceback)

The envelope is OpenAI's, so SDKs surface the message, plus Switchyard's ``reason`` code:
``{"error": {"message": …, "type": …, "code": …, "param": …, "reason": …}}``.
"""

from __future__ import annotations

from typing import Any

import orjson
from django.http import HttpResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from common.errors import GatewayError  # the envelope's base, at the bottom of the house


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class UnknownModel(InvalidRequest):
    status = 404
    code = "model_not_found"


class NotFound(InvalidRequest):
    status = 404
    code = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class IdempotencyConflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "idempotency_conflict"


class IdempotencyKeyReused(GatewayError):
    """An Idempotency-Key sent again with a different body: a client bug, not a retry."""

    status = 422
    type = "invalid_request_error"
    code = "idempotency_key_reused"


class JobNotCancellable(GatewayError):
    """DELETE /v1/jobs/{id} of a job a worker runs or that has finished."""

    status = 409
    type = "invalid_request_error"
    code = "job_not_cancellable"


class CapacityRefused(GatewayError):
    """The broker refused: the reason code names why, ``retry_after`` when to come back."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, reason: str, retry_after: float | None) -> None:
        super().__init__(message, reason=reason)
        self.retry_after = retry_after


class UpstreamError(GatewayError):
    status = 502
    type = "api_error"
    code = "upstream_error"


class UpstreamUnavailable(UpstreamError):
    code = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamRateLimited(UpstreamError):
    status = 429
    code = "upstream_rate_limited"

    def __init__(self, message: str, *, reason: str, retry_after: float | None = None) -> None:
        super().__init__(message, reason=reason)
        self.retry_after = retry_after


class UpstreamOverloaded(UpstreamError):
    status = 503
    code = "upstream_overloaded"


class UpstreamQuotaExhausted(UpstreamError):
    """The provider refused our account (spend cap, exhausted quota): the platform's problem.

    A 429 would tell the caller to slow down, which changes nothing; 503 says the service is
    out of something the caller cannot fix, with Retry-After when the provider said when.
    """

    status = 503
    code = "upstream_quota_exhausted"

    def __init__(self, message: str, *, reason: str, retry_after: float | None = None) -> None:
        super().__init__(message, reason=reason)
        self.retry_after = retry_after


class ServiceUnavailable(GatewayError):
    status = 503
    type = "api_error"
    code = "service_unavailable"


class BrokerUnavailable(ServiceUnavailable):
    """Redis is away: no capacity can be promised (the body's code is the header's reason)."""

    code = "broker_unavailable"


class InternalError(GatewayError):
    """Something raised that no step expected; the caller learns only that, and the id."""


def error_response(
    error: GatewayError, extra_headers: dict[str, str] | None = None
) -> HttpResponse:
    response = HttpResponse(
        orjson.dumps(error.envelope()), status=error.status, content_type="application/json"
    )
    for name, value in {**error.headers, **(extra_headers or {})}.items():
        response[name] = value
    return response


def drf_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF endpoints answer in the same envelope as the proxy."""
    if isinstance(exc, GatewayError):
        return Response(exc.envelope(), status=exc.status, headers=exc.headers)
    if isinstance(exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed):
        err: GatewayError = AuthenticationFailed("Invalid API key.")
    elif isinstance(exc, drf_exceptions.PermissionDenied):
        err = PermissionDenied(str(exc.detail), code="permission_denied")
    elif isinstance(exc, drf_exceptions.NotFound):
        err = NotFound(str(exc.detail))
    elif isinstance(exc, drf_exceptions.APIException):
        err = InvalidRequest(_flatten(exc.detail), code=exc.default_code)
        err.status = exc.status_code
    else:
        return None
    return Response(err.envelope(), status=err.status)


def _flatten(detail: Any) -> str:
    if isinstance(detail, dict):
        return "; ".join(f"{key}: {_flatten(value)}" for key, value in detail.items())
    if isinstance(detail, list):
        return "; ".join(_flatten(item) for item in detail)
    return str(detail)
