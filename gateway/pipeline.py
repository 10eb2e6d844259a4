"""The spine of one proxied request, top to bottom (SPEC C1–C7).

    identity → parse → model → endpoint → dispatch → respond → ledger

Each step is one call into the app that owns it; nothing clever lives here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from gateway import ledger
from gateway.errors import (
    AuthenticationFailed,
    BodyTooLarge,
    CapacityRefused,
    GatewayError,
    InvalidRequest,
    PermissionDenied,
    ServiceUnavailable,
    UnknownModel,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_response,
)
from gateway.providers import adapter_for
from gateway.providers.base import (
    Adapter,
    Classified,
    Outcome,
    RequestNotSupported,
    SSEParser,
    StreamError,
    UpstreamRequest,
    Usage,
)
from gateway.snapshot import Snapshot, holder
from gateway.upstream import client_for
from gateway.validation import chat_request_parse
from routing.catalogue import EndpointEntry, ModelEntry
from tenants.identity import Principal, bearer_secret

PROVIDER_HEADER = "x-switchyard-provider"
REQUEST_ID_HEADER = "x-request-id"


@dataclass
class Call:
    """What we know about one logical request as it moves down the spine."""

    id: str
    started: float  # monotonic
    created: float  # epoch seconds
    principal: Principal | None = None
    model: ModelEntry | None = None
    endpoint: EndpointEntry | None = None
    stream: bool = False
    ttft: float | None = None
    record: dict[str, Any] = field(default_factory=dict)


async def chat_completion(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    call = Call(id=f"gen-{uuid.uuid4().hex}", started=time.monotonic(), created=time.time())
    try:
        snapshot = await _snapshot()
        call.principal = _identify(snapshot, request, call.created)
        body = _parse(request)
        call.model = _model(snapshot, call.principal, body["model"])
        call.stream = bool(body.get("stream"))
        call.endpoint = _endpoint(call.model)
        if call.stream:
            return await _dispatch_stream(call, body)
        return await _dispatch(call, body)
    except GatewayError as error:
        _ledger(call, status=error.status, reason=error.reason)
        return error_response(error, {REQUEST_ID_HEADER: call.id})


async def models_list(request: HttpRequest) -> HttpResponse:
    """``GET /v1/models``: the models this key may use."""
    try:
        snapshot = await _snapshot()
        principal = _identify(snapshot, request, time.time())
    except GatewayError as error:
        return error_response(error)
    data = [
        {"id": slug, "object": "model", "created": 0, "owned_by": "switchyard"}
        for slug, model in sorted(snapshot.catalogue.models.items())
        if model.endpoints and principal.may_use(slug)
    ]
    return _json({"object": "list", "data": data})


async def _snapshot() -> Snapshot:
    try:
        return await holder.get()
    except Exception as exc:  # Redis or the database is down: say so, don't 500.
        raise ServiceUnavailable("Switchyard cannot read its configuration right now.") from exc


def _identify(snapshot: Snapshot, request: HttpRequest, now: float) -> Principal:
    secret = bearer_secret(request.headers.get("authorization"))
    principal = snapshot.keys.identify(secret, now=now) if secret else None
    if principal is None:
        raise AuthenticationFailed(
            "Invalid API key. Send 'Authorization: Bearer sk-sy-…' with an active key."
        )
    return principal


def _parse(request: HttpRequest) -> dict[str, Any]:
    try:
        raw = request.body
    except RequestDataTooBig:
        raise BodyTooLarge(
            f"Request body is larger than the limit of {settings.MAX_REQUEST_BODY_BYTES} bytes."
        ) from None
    return chat_request_parse(raw, max_bytes=settings.MAX_REQUEST_BODY_BYTES)


def _model(snapshot: Snapshot, principal: Principal, slug: str) -> ModelEntry:
    model = snapshot.catalogue.models.get(slug)
    if model is None or not model.endpoints:
        raise UnknownModel(f"The model '{slug}' does not exist.", param="model")
    if not principal.may_use(slug):
        raise PermissionDenied(f"This API key may not use the model '{slug}'.", param="model")
    return model


def _endpoint(model: ModelEntry) -> EndpointEntry:
    # The router (routing/) replaces this with a ranked plan; until then: the first endpoint.
    return model.endpoints[0]


async def _dispatch(call: Call, body: dict[str, Any]) -> HttpResponse:
    endpoint = _require(call.endpoint)
    adapter = adapter_for(endpoint.provider.protocol)
    wire = _wire_request(adapter, endpoint, body, stream=False)
    client = client_for(endpoint.provider.base_url)
    try:
        response = await client.post(
            wire.path, content=orjson.dumps(wire.json), headers=wire.headers
        )
    except httpx.TransportError as exc:
        raise _transport_failure(endpoint, exc) from None
    if response.status_code >= 400:
        classified = adapter.classify(response.status_code, response.headers, response.content)
        raise _upstream_failure(endpoint, classified, response)
    try:
        completion = adapter.parse_completion(
            response.json(),
            response_id=call.id,
            model=_require(call.model).slug,
            created=int(call.created),
        )
    except (ValueError, StreamError):
        raise UpstreamError(
            f"The provider '{endpoint.provider.name}' sent an invalid answer."
        ) from None
    call.ttft = time.monotonic() - call.started
    usage = completion.usage or Usage()
    result = completion.body
    result["provider"] = endpoint.provider.name
    result.setdefault("usage", usage.as_openai())["cost"] = _cost(endpoint, usage)
    _ledger(call, status=200, usage=usage, finish_reason=completion.finish_reason)
    return _json(result, headers=_served_headers(call))


async def _dispatch_stream(
    call: Call, body: dict[str, Any]
) -> HttpResponse | StreamingHttpResponse:
    endpoint = _require(call.endpoint)
    adapter = adapter_for(endpoint.provider.protocol)
    wire = _wire_request(adapter, endpoint, body, stream=True)
    client = client_for(endpoint.provider.base_url)
    upstream_request = client.build_request(
        "POST", wire.path, content=orjson.dumps(wire.json), headers=wire.headers
    )
    try:
        response = await client.send(upstream_request, stream=True)
    except httpx.TransportError as exc:
        raise _transport_failure(endpoint, exc) from None
    if response.status_code >= 400:
        try:
            content = await response.aread()
        finally:
            await response.aclose()
        classified = adapter.classify(response.status_code, response.headers, content)
        raise _upstream_failure(endpoint, classified, response)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    translator = adapter.stream_translator(
        response_id=call.id, model=_require(call.model).slug, created=int(call.created)
    )

    async def events() -> AsyncIterator[bytes]:
        parser = SSEParser()
        finished = False
        status, reason = 200, ""
        try:
            async for raw in response.aiter_bytes():
                for event in parser.feed(raw):
                    for chunk in translator.feed(event):
                        if call.ttft is None:
                            call.ttft = time.monotonic() - call.started
                        if chunk.get("usage") is not None and not chunk.get("choices"):
                            if not include_usage:
                                continue
                            chunk["usage"]["cost"] = _cost(endpoint, translator.usage or Usage())
                        chunk["provider"] = endpoint.provider.name
                        yield b"data: " + orjson.dumps(chunk) + b"\n\n"
                if translator.done:
                    break
            finished = translator.done
            if not finished:
                status, reason = 502, "upstream_stream_incomplete"
                yield _sse_error(UpstreamError("The provider ended the stream early."))
            yield b"data: [DONE]\n\n"
        except StreamError as exc:
            status, reason = 502, exc.classified.outcome.value
            yield _sse_error(
                UpstreamError(f"The provider failed mid-stream: {exc.classified.message}")
            )
            yield b"data: [DONE]\n\n"
        except httpx.TimeoutException:
            status, reason = 504, "upstream_timeout"
            yield _sse_error(UpstreamTimeout("The provider stopped sending."))
            yield b"data: [DONE]\n\n"
        except httpx.TransportError:
            status, reason = 502, "upstream_unavailable"
            yield _sse_error(UpstreamUnavailable("The connection to the provider broke."))
            yield b"data: [DONE]\n\n"
        finally:
            # Runs on completion, on error and when the client disconnects (Django cancels
            # this generator): closing the response cancels the upstream call.
            await response.aclose()
            cancelled = not finished and status == 200
            _ledger(
                call,
                status=499 if cancelled else status,
                reason="client_disconnected" if cancelled else reason,
                usage=translator.usage,
                finish_reason=translator.finish_reason,
                cancelled=cancelled,
            )

    streaming = StreamingHttpResponse(events(), content_type="text/event-stream")
    streaming["Cache-Control"] = "no-cache"
    streaming["X-Accel-Buffering"] = "no"
    for name, value in _served_headers(call).items():
        streaming[name] = value
    return streaming


def _wire_request(
    adapter: Adapter, endpoint: EndpointEntry, body: dict[str, Any], *, stream: bool
) -> UpstreamRequest:
    try:
        return adapter.build_request(
            body,
            upstream_model=endpoint.upstream_model,
            api_key=endpoint.provider.api_key,
            stream=stream,
            max_output=endpoint.max_output,
        )
    except RequestNotSupported as exc:
        raise InvalidRequest(
            f"The provider of this model cannot take this request: {exc}",
            code="unsupported_by_provider",
        ) from None


def _transport_failure(endpoint: EndpointEntry, exc: httpx.TransportError) -> GatewayError:
    # A connect timeout is "could not reach" (502), like a refused connection; 504 is for a
    # provider that took the request and then went quiet.
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return UpstreamTimeout(f"The provider '{endpoint.provider.name}' did not answer in time.")
    return UpstreamUnavailable(f"Could not reach the provider '{endpoint.provider.name}'.")


def _upstream_failure(
    endpoint: EndpointEntry, classified: Classified, response: httpx.Response
) -> GatewayError:
    """What the caller sees when the provider refused or failed."""
    message = (
        f"The provider '{endpoint.provider.name}' answered {response.status_code}: "
        f"{classified.message}"
    )
    reason = f"upstream_{classified.outcome.value}"
    if classified.outcome in (Outcome.CAPACITY, Outcome.POLICY):
        headers = {}
        if retry_after := response.headers.get("retry-after"):
            headers["Retry-After"] = retry_after
        return CapacityRefused(message, reason=reason, headers=headers)
    if classified.outcome is Outcome.REQUEST_ERROR:
        return InvalidRequest(message, reason=reason, code="upstream_rejected_request")
    if classified.outcome is Outcome.OVERLOAD:
        error = UpstreamError(message, reason=reason, code="upstream_overloaded")
        error.status = 503
        return error
    return UpstreamError(message, reason=reason)


def _sse_error(error: GatewayError) -> bytes:
    return b"data: " + orjson.dumps(error.envelope()) + b"\n\n"


def _served_headers(call: Call) -> dict[str, str]:
    return {PROVIDER_HEADER: _require(call.endpoint).provider.name, REQUEST_ID_HEADER: call.id}


def _cost(endpoint: EndpointEntry, usage: Usage) -> float:
    return round(
        endpoint.cost(
            input_tokens=usage.input_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            output_tokens=usage.output_tokens,
        ),
        10,
    )


def _ledger(
    call: Call,
    *,
    status: int,
    reason: str = "",
    usage: Usage | None = None,
    finish_reason: str = "",
    cancelled: bool = False,
) -> None:
    principal = call.principal
    if principal is None:  # unauthenticated: nobody to charge, nothing to record
        return
    usage = usage or Usage()
    endpoint = call.endpoint
    ledger.ledger_record_later(
        {
            "id": call.id,
            "created_at": call.created,
            "tenant_id": principal.tenant_id,
            "team_id": principal.team_id,
            "app_id": principal.app_id,
            "api_key_id": principal.key_id,
            "workload_class": principal.workload,
            "model": call.model.slug if call.model else "",
            "provider": endpoint.provider.name if endpoint else "",
            "upstream_model": endpoint.upstream_model if endpoint else "",
            "status": status,
            "reason_code": reason,
            "finish_reason": finish_reason or "",
            "streamed": call.stream,
            "cancelled": cancelled,
            "input_tokens": usage.input_tokens,
            "cached_input_tokens": usage.cached_input_tokens,
            "output_tokens": usage.output_tokens,
            "cost": _cost(endpoint, usage) if endpoint else 0.0,
            "latency_ms": (time.monotonic() - call.started) * 1000,
            "ttft_ms": call.ttft * 1000 if call.ttft is not None else None,
        }
    )


def _json(
    data: dict[str, Any], *, status: int = 200, headers: dict[str, str] | None = None
) -> HttpResponse:
    response = HttpResponse(orjson.dumps(data), status=status, content_type="application/json")
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _require(value: Any) -> Any:
    assert value is not None
    return value
