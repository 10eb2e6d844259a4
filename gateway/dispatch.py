"""One upstream attempt (SPEC C5): send the request to an endpoint, classify what came back.

No retries here (F4): the pipeline decides what happens after a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
import orjson
from yarl import URL

from gateway.doors.base import CanonicalRequest
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    UpstreamError,
    UpstreamOverloaded,
    UpstreamQuotaExhausted,
    UpstreamRateLimited,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.providers import adapter_for
from gateway.providers.base import (
    Adapter,
    Classified,
    Completion,
    Outcome,
    RateLimitInfo,
    RequestNotSupported,
    StreamError,
)
from gateway.upstream import UpstreamStream, proxy_for, session_for, session_url
from routing.catalogue import EndpointEntry

UPSTREAM_WORDS = {
    Outcome.CAPACITY: "rate limited",
    Outcome.OVERLOAD: "overloaded",
    Outcome.POLICY: "quota, spend limit or access refused",
    Outcome.AUTH: "it refused Switchyard's credential; the platform admins must fix it",
    Outcome.PROVIDER_ERROR: "provider error",
    Outcome.REQUEST_ERROR: "it rejected the request",
    Outcome.OK: "no error",
}


@dataclass
class Attempt:
    """What one attempt produced: a completion, an open stream, or a classified failure."""

    endpoint: EndpointEntry
    adapter: Adapter
    limits: RateLimitInfo = field(default_factory=RateLimitInfo)
    completion: Completion | None = None
    stream: UpstreamStream | None = None
    failure: Classified | None = None
    error: GatewayError | None = None  # what the caller sees if this failure is the last word
    status: int = 0  # the provider's HTTP status when it answered with an error
    seconds: float = 0.0  # until the answer (or its first byte, for streams)
    sent: bool = True  # False: the adapter could not express the request, nothing went out
    passthrough: bool = False  # the door's own body went out; the provider's answers come back

    @property
    def ok(self) -> bool:
        return self.failure is None


async def attempt_send(
    endpoint: EndpointEntry,
    request: CanonicalRequest,
    *,
    response_id: str,
    model: str,
    created: int,
    on_send: Callable[[], None] = lambda: None,
    api_key: str | None = None,
    idempotency_key: str = "",
) -> Attempt:
    """``on_send`` is called just before the request goes out: from then on, whatever
    happens, the provider may have received it.

    A provider that speaks the door's own protocol gets the door's body as it is
    (``passthrough``); any other gets the canonical body in its protocol. ``idempotency_key``,
    when given, goes out as ``Idempotency-Key`` (a job's id: its re-sent run is the same call)."""
    adapter = adapter_for(endpoint.provider.protocol)
    passthrough = request.native is not None and adapter.protocol == request.door.protocol
    attempt = Attempt(endpoint=endpoint, adapter=adapter, passthrough=passthrough)
    name = endpoint.provider.name
    # B2: the pool key admission chose; the account's own key without a pool.
    key = endpoint.provider.api_key if api_key is None else api_key
    stream = request.stream
    embed = request.operation == "embed"
    try:
        if embed:
            wire = adapter.build_embeddings_request(
                request.body,
                upstream_model=endpoint.upstream_model,
                api_key=key,
            )
        elif passthrough:
            assert request.native is not None
            wire = adapter.build_native_request(
                request.native,
                upstream_model=endpoint.upstream_model,
                api_key=key,
                stream=stream,
                max_output=endpoint.max_output,
                headers=request.headers,
            )
        else:
            wire = adapter.build_request(
                request.body,
                upstream_model=endpoint.upstream_model,
                api_key=key,
                stream=stream,
                max_output=endpoint.max_output,
            )
    except RequestNotSupported as exc:
        attempt.sent = False
        return _failed(
            attempt,
            Classified(Outcome.REQUEST_ERROR, str(exc)),
            InvalidRequest(
                f"The provider '{name}' cannot take this request: {exc}",
                code="unsupported_by_provider",
            ),
        )
    headers = wire.headers
    if idempotency_key:
        headers = {**headers, "Idempotency-Key": idempotency_key}
    base = endpoint.provider.base_url
    content = orjson.dumps(wire.json)
    if stream:
        return await _send_streamed(
            attempt, base, session_url(base, wire.path), content, headers, on_send
        )
    started = time.monotonic()
    on_send()
    proxy = proxy_for(base)
    try:
        async with session_for(base).post(
            session_url(base, wire.path),
            data=content,
            headers=headers,
            allow_redirects=False,
            proxy=proxy.url,
            proxy_auth=proxy.auth,
        ) as response:
            body = await response.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        attempt.seconds = time.monotonic() - started
        return _unreachable(attempt, name, exc, timed_out=_read_timeout(exc))
    attempt.seconds = time.monotonic() - started
    attempt.limits = adapter.rate_limits(response.headers, now=time.time())
    if response.status >= 400:
        return _refused(attempt, name, response.status, response.headers, body)
    try:
        data = orjson.loads(body)
        if embed:
            attempt.completion = adapter.parse_embeddings(data, model=model)
        else:
            attempt.completion = adapter.parse_completion(
                data, response_id=response_id, model=model, created=created
            )
        if passthrough:
            attempt.completion.native = data
    except (ValueError, StreamError):
        classified = Classified(Outcome.PROVIDER_ERROR, "invalid answer")
        return _failed(
            attempt, classified, UpstreamError(f"The provider '{name}' sent an invalid answer.")
        )
    return attempt


async def _send_streamed(
    attempt: Attempt,
    base: str,
    url: URL,
    content: bytes,
    headers: Mapping[str, str],
    on_send: Callable[[], None],
) -> Attempt:
    """A streamed answer: its status and headers read here, its body by ``gateway.streaming``
    (``attempt.stream``)."""
    name = attempt.endpoint.provider.name
    started = time.monotonic()
    on_send()
    proxy = proxy_for(base)
    try:
        response = await session_for(base).post(
            url,
            data=content,
            headers=headers,
            allow_redirects=False,
            proxy=proxy.url,
            proxy_auth=proxy.auth,
        )
    except (TimeoutError, aiohttp.ClientError) as exc:
        attempt.seconds = time.monotonic() - started
        return _unreachable(attempt, name, exc, timed_out=_read_timeout(exc))
    attempt.seconds = time.monotonic() - started
    attempt.limits = attempt.adapter.rate_limits(response.headers, now=time.time())
    if response.status >= 400:
        try:
            body = await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            return _unreachable(attempt, name, exc, timed_out=_read_timeout(exc))
        finally:
            response.release()
        return _refused(attempt, name, response.status, response.headers, body)
    attempt.stream = UpstreamStream(response)
    return attempt


def _read_timeout(exc: BaseException) -> bool:
    """A provider that took the request and then went quiet (504), as httpx_aiohttp mapped
    aiohttp's errors for httpx before: a read timeout, or the pool's wait for a connection.
    A connect timeout or any other connection error is "could not reach" (502)."""
    if isinstance(exc, aiohttp.ClientError):
        return isinstance(exc, aiohttp.SocketTimeoutError)
    return True


def _unreachable(attempt: Attempt, name: str, exc: BaseException, *, timed_out: bool) -> Attempt:
    # A connect timeout is "could not reach" (502), like a refused connection; 504 is for
    # a provider that took the request and then went quiet.
    if timed_out:
        error: GatewayError = UpstreamTimeout(f"The provider '{name}' did not answer in time.")
    else:
        error = UpstreamUnavailable(f"Could not reach the provider '{name}'.")
    return _failed(attempt, Classified(Outcome.PROVIDER_ERROR, str(exc) or error.message), error)


def _refused(
    attempt: Attempt, name: str, status: int, headers: Mapping[str, str], body: bytes
) -> Attempt:
    attempt.status = status
    classified = attempt.adapter.classify(status, headers, body)
    error = caller_error(name, status, classified, attempt.limits.retry_after)
    return _failed(attempt, classified, error)


def _failed(attempt: Attempt, classified: Classified, error: GatewayError) -> Attempt:
    attempt.failure = classified
    attempt.error = error
    return attempt


def caller_error(
    provider: str, status: int, classified: Classified, retry_after: float | None
) -> GatewayError:
    """What the caller sees when this provider failure ends the request.

    Only a rejection of the caller's own request passes the provider's words on (H1): the
    others speak of our credential, organisation and the shared pool's usage, never the
    caller's business (they stay in ``classified`` for logs).
    """
    reason = f"upstream_{classified.outcome.value}"
    if classified.outcome is Outcome.REQUEST_ERROR:
        message = f"The provider '{provider}' answered {status}: {classified.message}"
        return InvalidRequest(message, reason=reason, code="upstream_rejected_request")
    message = f"The provider '{provider}' answered {status} ({UPSTREAM_WORDS[classified.outcome]})."
    if classified.outcome is Outcome.OVERLOAD:
        return UpstreamOverloaded(message, reason=reason)
    if classified.outcome is Outcome.CAPACITY:
        # A refusal always says when to come back (H1); Retry-After is never below a second.
        return UpstreamRateLimited(message, reason=reason, retry_after=max(1.0, retry_after or 0))
    if classified.outcome is Outcome.POLICY:
        return UpstreamQuotaExhausted(message, reason=reason, retry_after=retry_after)
    return UpstreamError(message, reason=reason)
