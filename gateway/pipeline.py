"""The spine of one proxied request, top to bottom (SPEC C1–C7), the same for every door.

    identify → parse (the door) → model → workload → plan → ┌ admit (reserve, or wait fairly)
                                                            │ dispatch
                                                            │ reconcile
                                                            └ decide: respond, retry, fall
                                                              back, refuse

Each step is one call into the app that owns it; nothing clever lives here. The door
(``gateway/doors``) parses its protocol once into a ``CanonicalRequest`` and renders answers and
refusals in its own protocol; the first steps are in ``intake``, a good answer (whole or
streamed) and the grant's settlement in ``answers``, the headers every answer carries in
``responses``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import orjson
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from redis.exceptions import RedisError

from common.faultlog import faults
from gateway import idempotency, jobs, ledger, metrics, sent_pins
from gateway.admission import Admitted, admit, attempt_label, capacity_wait_refusal
from gateway.answers import answer_complete, answer_stream, grant_abandoned, grant_owned
from gateway.call import DEFAULT_WORKLOAD, Call
from gateway.dispatch import Attempt, attempt_send
from gateway.doors import door_for
from gateway.doors.base import CanonicalRequest, Door
from gateway.doors.chat import SESSION_HEADER
from gateway.errors import (
    AuthenticationFailed,
    BrokerUnavailable,
    CapacityRefused,
    GatewayError,
    InternalError,
    InvalidRequest,
    PermissionDenied,
    ServiceUnavailable,
    UnknownModel,
)
from gateway.intake import principal_identify, raw_body, snapshot_current, workload_choose
from gateway.models import Job
from gateway.providers.base import Outcome
from gateway.records import generation_record, reservation_record
from gateway.responses import SHOULD_RETRY_HEADER, json_response, response_headers
from gateway.snapshot import Snapshot
from quotas.broker import Broker, broker_get, demand_usage
from quotas.core.model import Reason
from quotas.core.retry import Failure, Next, retry_decide
from routing.catalogue import EndpointEntry, ModelEntry
from routing.core.contracts import contract_refusal
from routing.core.overrides import model_suffix_split
from routing.core.planner import RoutingRequest, plan_explanation
from routing.core.stats import Outcome as RoutingOutcome
from routing.core.sticky import conversation_key
from routing.live import live_router
from tenants.identity import Principal

log = logging.getLogger(__name__)
_Answer = TypeVar("_Answer")

# The retry delays' jitter (F1), one generator per process: a Random() per request seeded
# itself from os.urandom (2.5 KB of MT state), 0.7 % of a request's CPU in a profile.
_RETRY_RNG = random.Random()

# A deferred job that met Redis away tries again this much later (s).
BROKER_AWAY_RETRY_SECONDS = 2.0

# What an attempt's outcome tells the router about the endpoint (G6–G8); None: nothing.
ROUTING_KINDS = {
    Outcome.CAPACITY: "rate_limited",
    Outcome.OVERLOAD: "fault",
    Outcome.PROVIDER_ERROR: "fault",
    Outcome.AUTH: "fault",
    Outcome.POLICY: "fault",  # a spend cap or exhausted quota persists: the breaker's case
    Outcome.REQUEST_ERROR: None,  # the caller's fault says nothing about the endpoint
}
# F1: provider outcomes → retry classes.
FAILURES = {
    Outcome.CAPACITY: Failure.CAPACITY,
    Outcome.OVERLOAD: Failure.OVERLOAD,
    Outcome.PROVIDER_ERROR: Failure.PROVIDER_ERROR,
    # Our credential for that provider: another may serve the request, this one will not
    # until an admin fixes it (retrying it only spends the budget).
    Outcome.AUTH: Failure.POLICY,
    Outcome.POLICY: Failure.POLICY,
    Outcome.REQUEST_ERROR: Failure.REQUEST_ERROR,
}


async def serve(
    request: HttpRequest, door: Door, *, identified: Principal | None = None
) -> HttpResponse | StreamingHttpResponse:
    """One request through its door: the answer, or its refusal in the door's envelope.
    ``identified``: the caller, when the door's intake has looked up the key already."""
    call = Call(door=door)

    async def steps() -> HttpResponse | StreamingHttpResponse:
        snapshot = await snapshot_current()
        call.principal = identified or principal_identify(snapshot, request, call.created)
        raw = raw_body(request)
        call.request = canonical = door.parse(raw, request.headers)
        call.model = _model(snapshot, call.principal, canonical.body, call=call)
        call.workload = workload_choose(snapshot, call, request)
        call.stream = canonical.stream
        deferred = jobs.wants_deferral(request, call)
        if deferred:
            jobs.job_storable(raw, canonical.body)
        call.idempotency_key = idempotency.request_key(request)
        replay = await idempotency.claim(call, idempotency.body_digest(raw))
        if replay is not None:
            return replay
        if deferred:
            job = await jobs.job_submit(call, orjson.loads(raw), canonical.session_id or "")
            call.reason = "deferred"
            headers = {**response_headers(call), "Location": f"/v1/jobs/{job.id}"}
            response = json_response(jobs.job_data(job), status=202, headers=headers)
        else:
            response = await _respond(call, snapshot, canonical)
        if isinstance(response, HttpResponse) and response.status_code < 300:
            # A streamed answer is remembered when it ends (``answer_stream``).
            await idempotency.remember(
                call, response.status_code, response.content, dict(response.items())
            )
        return response

    answer = await _guarded(call, steps())
    if not isinstance(answer, StreamingHttpResponse) and call.reason != "broker_unavailable":
        # I2: an answer the client holds has its ledger row in Redis (a stream: at its end).
        await ledger.ledger_committed()
    return answer


async def job_attempt(
    job: Job,
    *,
    try_until: float,
    last_try: bool,
    seen: Callable[[Call], None] = lambda call: None,
) -> HttpResponse | CapacityRefused:
    """One run of a deferred request (gateway/job_runner.py): its answer, or — refused for
    capacity, or Redis away, before the job's deadline — the refusal, so the job waits and
    tries again. ``seen`` is shown the run's call (its queue wait, the pools' headroom)."""
    door = door_for(job.door)
    call = Call(id=job.generation_id, created=job.created_at.timestamp(), run=job.tries, door=door)
    seen(call)
    call.upstream_key = job.id
    call.retried_later = not last_try

    async def run() -> HttpResponse | CapacityRefused:
        snapshot = await snapshot_current()
        call.principal = snapshot.keys.principal_of(job.api_key_id, now=time.time())
        if job.tries > 1:  # an earlier run may have sent it: the same provider holds its key
            call.pinned_endpoint = await sent_pins.sent_pinned(job.id)
        if call.principal is None:
            raise AuthenticationFailed("The API key that submitted this job is no longer active.")
        headers = {SESSION_HEADER: job.session_id} if job.session_id else {}
        call.request = canonical = door.parse(orjson.dumps(job.request), headers)
        call.model = _model(snapshot, call.principal, canonical.body)
        workload = snapshot.quotas.workloads.get(job.workload_class, DEFAULT_WORKLOAD)
        # This run waits for capacity until try_until; the job, until its own deadline.
        until = min(job.deadline_at.timestamp(), try_until)
        call.workload = replace(workload, deadline_seconds=until - call.created)
        try:
            response = await _respond(call, snapshot, canonical)
        except CapacityRefused as refused:
            # Never admitted, however long it waits: the answer now, not at the deadline.
            if last_try or refused.reason == Reason.UNSATISFIABLE.value:
                raise
            return refused
        assert isinstance(response, HttpResponse)  # a job never streams
        return response

    async def steps() -> HttpResponse | CapacityRefused:
        try:
            return await run()
        except (RedisError, ServiceUnavailable):
            # Redis away for a moment is no answer for work that may wait (E3): before any
            # provider call, the job waits and tries again as when capacity is short; only its
            # last try reports the outage.
            if last_try or call.attempts:
                raise
            return CapacityRefused(
                "Switchyard's rate-limit state is unavailable.",
                reason="broker_unavailable",
                retry_after=BROKER_AWAY_RETRY_SECONDS,
            )

    return await _guarded(call, steps())


async def _guarded(call: Call, steps: Awaitable[_Answer]) -> _Answer | HttpResponse:
    """Run the request's steps; every failure becomes an answer in the envelope and a ledger
    row, and gives its Idempotency-Key back."""
    try:
        return await steps
    except RedisError:
        # The broker cannot promise capacity without its shared state: refuse, don't guess.
        faults.warning(log, "request:redis", "Redis failed during a request")
        error = BrokerUnavailable("Switchyard's rate-limit state is unavailable; retry shortly.")
        call.reason = "broker_unavailable"
        generation_record(call, status=error.status)
        await idempotency.release(call)
        return call.door.error_response(
            error, {**response_headers(call, retry_after=1.0), SHOULD_RETRY_HEADER: "true"}
        )
    except GatewayError as error:
        call.reason = error.reason
        generation_record(call, status=error.status)
        await idempotency.release(call)
        headers = response_headers(call, retry_after=_retry_after(error))
        headers[SHOULD_RETRY_HEADER] = "true" if _worth_retrying(call, error) else "false"
        return call.door.error_response(error, headers)
    except asyncio.CancelledError:  # the client left, perhaps while waiting for capacity
        if not call.recorded:  # C8: the ledger shows it, even if no provider ever saw it
            call.reason = "client_disconnected"
            generation_record(call, status=499, cancelled=True)
        await idempotency.release(call)
        raise
    except Exception:  # a bug; its grant, if any, was settled on the way out (``grant_owned``)
        log.exception("request %s failed unexpectedly", call.id)
        error = InternalError("Switchyard failed to serve this request; it has been logged.")
        call.reason = "internal_error"
        try:
            if not call.recorded:  # one row per generation: a late failure keeps the first
                generation_record(call, status=error.status)
        except Exception:  # the ledger itself may be what failed: the answer still goes out
            log.exception("request %s: its ledger row could not be written", call.id)
        await idempotency.release(call)
        headers = response_headers(call)
        headers[SHOULD_RETRY_HEADER] = "false"
        return call.door.error_response(error, headers)


async def _respond(
    call: Call, snapshot: Snapshot, request: CanonicalRequest
) -> HttpResponse | StreamingHttpResponse:
    """Plan and serve; no capacity for a degrading class: its model's fallback (E2)."""
    try:  # the plan itself may refuse for capacity (every candidate full past the deadline)
        return await _serve(call, snapshot, request, await _plan(call, snapshot, request))
    except CapacityRefused as refused:
        if not call.may_degrade:
            raise
        request = _degrade(call, snapshot, request)
        try:
            candidates = await _plan(call, snapshot, request)
        except InvalidRequest:
            if not call.contract_refused:
                raise
            # F5: the fallback model has no endpoint inside the route's contract: the refusal
            # stays the capacity one, and says which clause kept each endpoint out.
            _contract_named(call, refused)
            raise refused from None
        return await _serve(call, snapshot, request, candidates)


def _model(
    snapshot: Snapshot, principal: Principal, body: dict[str, Any], *, call: Call | None = None
) -> ModelEntry:
    """The requested model (a ``:floor`` / ``:nitro`` suffix aside), and its fallbacks' checks.

    Given the ``call``, a refusal here is counted under the app's class and the model asked
    (H2), not under "default" and "": neither would be known yet."""
    if call is not None:
        call.workload = snapshot.quotas.workloads.get(principal.workload, DEFAULT_WORKLOAD)
    found: ModelEntry | None = None
    for param, requested in [
        ("model", body["model"]),
        *(("models", m) for m in body.get("models") or ()),
    ]:
        name, _ = model_suffix_split(requested)
        model = snapshot.catalogue.model_named(name)  # its slug, or an alias (issue 16 item 5)
        if model is None or not model.endpoints:
            # An unknown name stays out of the labels: clients could mint any number of them.
            raise UnknownModel(f"The model '{requested}' does not exist.", param=param)
        if call is not None and found is None:
            call.model = model
        if not principal.may_use(model.slug):
            raise PermissionDenied(
                f"This API key may not use the model '{model.slug}'.", param=param
            )
        found = found or model
    assert found is not None
    return found


def _degrade(call: Call, snapshot: Snapshot, request: CanonicalRequest) -> CanonicalRequest:
    """E2: no capacity now for an interactive request whose class degrades: its model's
    fallback serves it instead (queueing there as usual)."""
    model = _require_model(call)
    assert model.fallback_slug is not None
    call.degraded_from = model.slug
    call.model = snapshot.catalogue.models[model.fallback_slug]
    call.explanation.append(f"degraded:{model.slug}->{call.model.slug}")
    call.request = request.with_model(call.model.slug)
    return call.request


async def _plan(call: Call, snapshot: Snapshot, request: CanonicalRequest) -> list[EndpointEntry]:
    """The router's ranked candidates (G1–G14), honouring the caller's overrides."""
    principal = call.principal
    assert principal is not None
    live = live_router()
    live.configure(snapshot.version, snapshot.catalogue)
    messages = request.body.get("messages") or []
    call.conversation = (
        conversation_key(
            tenant=str(principal.tenant_id),
            model=_require_model(call).slug,
            session_id=request.session_id,
            user=request.user,
            messages=messages,
        )
        if messages
        else None
    )
    later_turn = any(m.get("role") == "assistant" for m in messages)
    sticky = (
        await live.sticky_get(call.conversation)
        if call.conversation is not None and later_turn
        else None
    )
    catalogue = snapshot.catalogue
    plan = live.plan(
        RoutingRequest(
            model=catalogue.routing_name(request.model),
            input_tokens=float(request.estimate.input_tokens),
            max_tokens=request.estimate.max_output,
            features=request.features,
            provider=request.preferences,
            models=tuple(catalogue.routing_name(m) for m in request.models),
            tenant_sort=principal.tenant_default_sort or None,
            sticky=sticky,
            contract_reference=call.contract_reference if call.degraded_from else None,
            contract=call.workload.contract,
            deadline_s=max(0.0, call.deadline - time.time()),
        )
    )
    if not call.degraded_from:
        call.contract_reference = plan.contract_reference()
    call.route = plan_explanation(plan)
    call.planned = (plan.input_tokens, plan.output_tokens)
    call.broken = frozenset(who for who, why in plan.demoted if why == "breaker")
    call.contract_refused = plan.contract_refused
    if not plan.attempts and plan.capacity_refused is not None:
        raise capacity_wait_refusal(call, *plan.capacity_refused)
    if not plan.attempts:
        reasons = ", ".join(f"{who}: {why}" for who, why in plan.refused) or "none configured"
        raise InvalidRequest(
            f"No endpoint can serve this request ({reasons}).", code="no_endpoint_available"
        )
    candidates = [snapshot.catalogue.endpoints[endpoint.id] for endpoint in plan.attempts]
    return sent_pins.pinned_first(candidates, call.pinned_endpoint)


async def _serve(
    call: Call, snapshot: Snapshot, request: CanonicalRequest, candidates: list[EndpointEntry]
) -> HttpResponse | StreamingHttpResponse:
    """Admit, dispatch, reconcile, and retry or fall back within one budget (F1–F5, G14)."""
    broker = broker_get()
    live = live_router()
    model = _require_model(call)
    while True:
        waited_before = call.queue_wait
        admitted = await admit(call, snapshot, request, candidates, broker)
        async with grant_owned(admitted, broker):
            call.attempts += 1
            try:
                attempt = await _dispatch(call, request, admitted, broker)
            except asyncio.CancelledError:  # the client left: the upstream call went with it
                await grant_abandoned(call, admitted, broker)
                raise
            outcome = attempt.failure.outcome.value if attempt.failure else "ok"
            metrics.child(metrics.ATTEMPTS, admitted.endpoint.provider.name, outcome).inc()
            step = {
                "provider": admitted.endpoint.provider.name,
                "model": admitted.endpoint.model_slug,
                "outcome": outcome if attempt.sent else "unsupported",
                "queue_wait_ms": round((call.queue_wait - waited_before) * 1000, 1),
                "ms": round(attempt.seconds * 1000, 1),
            }
            call.timeline.append(step)
            if attempt.ok:
                if attempt.stream is not None:
                    return answer_stream(call, attempt, admitted, broker, live)
                return await answer_complete(call, attempt, admitted, broker, live)
            # F4: a call the provider received counts against its request rate and spend.
            sent = admitted.reserved_usage() if attempt.sent else None
            released = await broker.release(admitted.grant, sent=sent)
            admitted.settled = True
            reservation_record(
                call, admitted.endpoint, admitted.grant, released, estimated_spend=admitted.spend
            )
            failure = attempt.failure
            assert failure is not None and attempt.error is not None
            if failure.outcome in (Outcome.AUTH, Outcome.POLICY):
                # The caller is told only the outcome (H1); the provider's words are for operators.
                log.warning(
                    "provider %s refused %s: %s",
                    admitted.endpoint.provider.name,
                    failure.outcome.value,
                    failure.message,
                )
            if _key_refused(attempt, admitted):
                # B2: the provider refused this key, not the request: out of the pool at once;
                # the provider stays in routing, and another key of its pool takes the retry.
                now = time.time()
                why = f"{attempt.status} {failure.message}"
                await broker.key_failed(admitted.buckets, why, now)
                label = attempt_label(admitted.endpoint, admitted.buckets.credential)
                metrics.child(metrics.KEYS_REFUSED, admitted.endpoint.provider.name).inc()
                call.explanation.append(f"{label}:key_refused")
                budget_left = call.attempts - 1 < call.workload.retry_budget
                usable = broker.keys_usable(admitted.endpoint.provider, now)
                if budget_left and now < call.deadline and usable:
                    step["next"] = "another_key"
                    continue
            if not attempt.sent and len(candidates) > 1:
                # Another endpoint may speak this request; nothing was sent, so no retry (F4).
                call.attempts -= 1
                call.explanation.append(f"{admitted.endpoint.provider.name}:unsupported")
                candidates = [e for e in candidates if e is not admitted.endpoint]
                continue
            if kind := ROUTING_KINDS[failure.outcome]:
                live.observe(
                    admitted.endpoint.key, RoutingOutcome(kind=kind, latency_s=attempt.seconds)
                )
            retry_after = attempt.limits.retry_after
            if retry_after is not None:
                metrics.child(metrics.RETRY_AFTER, admitted.endpoint.provider.name).inc()
            if failure.outcome is Outcome.CAPACITY:
                demand = demand_usage(admitted.demand, admitted.endpoint)
                if await broker.observe_refusal(admitted.buckets, demand, attempt.limits):
                    metrics.child(metrics.UNEXPLAINED_429, admitted.endpoint.provider.name).inc()
                if retry_after:
                    await broker.pause_provider(
                        admitted.buckets,
                        retry_after,
                        time.time(),
                        demand=demand,
                        limits=attempt.limits,
                    )
            decision = retry_decide(
                FAILURES[failure.outcome],
                retries_used=call.attempts - 1,
                retry_budget=call.workload.retry_budget,
                retry_after=retry_after,
                now=time.time(),
                deadline=call.deadline,
                expected_attempt_seconds=max(attempt.seconds, 0.05),
                fallback_allowed=model.allow_fallbacks,
                endpoints_left=len(candidates) - 1,
                rng=_RETRY_RNG,
                breaker_open=admitted.endpoint.key in call.broken,
            )
            call.explanation.append(f"{admitted.endpoint.provider.name}:{failure.outcome.value}")
            step["next"] = decision.next.value
            if decision.next is Next.GIVE_UP:
                attempt.error.reason = f"{attempt.error.reason}:{decision.reason}"
                if len(candidates) == 1:
                    _contract_named(call, attempt.error)
                raise attempt.error
            if decision.next is Next.NEXT_ENDPOINT:
                candidates = [e for e in candidates if e is not admitted.endpoint]
            else:
                await asyncio.sleep(decision.delay)


async def _dispatch(
    call: Call, request: CanonicalRequest, admitted: Admitted, broker: Broker
) -> Attempt:
    call.endpoint = admitted.endpoint
    if call.upstream_key:  # before it goes out: a run that dies after this is re-sent there
        await sent_pins.sent_pin(call.upstream_key, admitted.endpoint.key)
    send = attempt_send(
        admitted.endpoint,
        request,
        response_id=call.id,
        model=admitted.endpoint.model_slug,
        created=int(call.created),
        on_send=admitted.mark_sent,
        api_key=admitted.api_key,
        idempotency_key=call.upstream_key,
    )
    if call.stream:  # the stream's own lease keeper starts with the relay
        return await send
    async with broker.held(admitted.grant):
        return await send


def _contract_named(call: Call, error: GatewayError) -> None:
    """F5: the first choice failed with no fallback left because the route's contract kept
    them out: the refusal says which clause stopped each (message, reason, explanation)."""
    if not call.contract_refused:
        return
    model = call.degraded_from or _require_model(call).slug  # the route whose contract it is
    if call.workload.contract is not None:  # which narrowed it
        model = f"{model}, class {call.workload.name}"
    sentences = [contract_refusal(model, who, clause) for who, clause in call.contract_refused]
    error.message = f"{error.message} {'; '.join(sentences)}."
    error.reason = f"{error.reason}:fallback_contract"
    call.explanation.extend(f"{who}:contract({clause})" for who, clause in call.contract_refused)


def _key_refused(attempt: Attempt, admitted: Admitted) -> bool:
    """A 401 (or 403) from the provider on a pooled key: the key is refused, not the request."""
    credential = admitted.buckets.credential
    if credential is None or credential.id is None or attempt.failure is None:
        return False
    outcome = attempt.failure.outcome
    return outcome is Outcome.AUTH or (outcome is Outcome.POLICY and attempt.status == 403)


def _worth_retrying(call: Call, error: GatewayError) -> bool:
    """Should the client's SDK retry (``x-should-retry``, which OpenAI's SDKs obey)? Only a
    refusal before any provider call, after its Retry-After: the gateway already spent the
    retry budget on the rest, and an SDK retrying on top multiplies the calls (F4)."""
    return isinstance(error, CapacityRefused) and call.attempts == 0


def _retry_after(error: GatewayError) -> float | None:
    value = getattr(error, "retry_after", None)
    return float(value) if value is not None else None


def _require_model(call: Call) -> ModelEntry:
    assert call.model is not None
    return call.model
