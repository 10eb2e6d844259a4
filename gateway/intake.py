"""The request's first steps on the spine (``pipeline``): the configuration snapshot, who is
asking (A3, C1), the body as received, and the workload class it runs as (E1)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest

from gateway.call import Call
from gateway.errors import (
    AuthenticationFailed,
    BodyTooLarge,
    InvalidRequest,
    PermissionDenied,
    ServiceUnavailable,
)
from gateway.snapshot import Snapshot, holder
from quotas.snapshot import Workload
from tenants.identity import Principal, api_key_secret, bearer_secret

WORKLOAD_HEADER = "x-switchyard-workload"


async def snapshot_current() -> Snapshot:
    try:
        return await holder.get()
    except Exception as exc:  # Redis or the database is down: say so, don't 500.
        raise ServiceUnavailable("Switchyard cannot read its configuration right now.") from exc


def principal_identify(snapshot: Snapshot, request: HttpRequest, now: float) -> Principal:
    """The key's owner. ``Authorization: Bearer`` or, as Anthropic's clients send it,
    ``x-api-key``: either door may be spoken with either header."""
    secret = bearer_secret(request.headers.get("authorization")) or api_key_secret(
        request.headers.get("x-api-key")
    )
    principal = snapshot.keys.identify(secret, now=now) if secret else None
    if principal is None:
        raise AuthenticationFailed(
            "Invalid API key. Send 'Authorization: Bearer sk-sy-…' (or 'x-api-key: sk-sy-…') "
            "with an active key."
        )
    return principal


def raw_body(request: HttpRequest) -> bytes:
    try:
        return request.body
    except RequestDataTooBig:
        raise BodyTooLarge(
            f"Request body is larger than the limit of {settings.MAX_REQUEST_BODY_BYTES} bytes."
        ) from None


def workload_choose(snapshot: Snapshot, call: Call, request: HttpRequest) -> Workload:
    """The request's workload class: the app's (set on the call by ``_model``), or a lighter
    one that the request names."""
    workloads = snapshot.quotas.workloads
    default = call.workload
    asked = request.headers.get(WORKLOAD_HEADER)
    if asked and asked != default.name:
        chosen = workloads.get(asked)
        if chosen is None:
            raise InvalidRequest(f"There is no workload class '{asked}'.", code="unknown_workload")
        if chosen.weight > default.weight:
            raise PermissionDenied(
                f"This app may not send '{asked}' work (heavier than its class '{default.name}').",
                code="workload_not_allowed",
            )
        return chosen
    return default
