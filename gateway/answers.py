"""A good answer on the spine (``pipeline``), whole or streamed (C6, C7): the grant reconciled
with the usage the provider reported, the ledger rows, live stats and the conversation's pin
for the router, the answer remembered under its Idempotency-Key; and the grant's settlement
when a step fails or the client leaves (C9, C10)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from django.http import HttpResponse, StreamingHttpResponse
from redis.exceptions import RedisError

from common.faultlog import faults
from gateway import idempotency, ledger
from gateway.admission import Admitted
from gateway.call import Call
from gateway.dispatch import Attempt
from gateway.doors.base import Rendering
from gateway.providers.base import Usage
from gateway.quality import tool_calls_malformed
from gateway.records import (
    Answered,
    generation_record,
    reservation_metrics,
    reservation_record,
    reservation_settled,
    reservation_taken,
    usage_cost,
)
from gateway.responses import headers_add, json_response, response_headers
from gateway.steps import StreamSteps
from gateway.streaming import StreamEnd, relay
from quotas.broker import Broker, actual_usage
from routing.core.stats import Outcome as RoutingOutcome
from routing.core.sticky import StickyState
from routing.live import LiveRouter

log = logging.getLogger(__name__)

STREAM_RESERVATION_HEADER = "x-switchyard-stream-reservation"  # max | increments (C10)
RESERVED_OUTPUT_HEADER = "x-switchyard-reserved-output-tokens"  # held as the stream starts


@contextlib.asynccontextmanager
async def grant_owned(admitted: Admitted, broker: Broker) -> AsyncIterator[None]:
    """While a step holds the grant, anything it raises settles the grant on the way out, so
    no failure keeps capacity other requests wait for (C9): released whole if nothing went
    to the provider; else its estimates stand, as after an expired lease, since the provider
    may have counted and charged the call. Normal exits leave the grant to its owner."""
    try:
        yield
    except BaseException:
        if not admitted.settled:
            admitted.settled = True
            with contextlib.suppress(Exception):  # a step in flight lands before the settle
                await admitted.steps_over()
            estimated = admitted.estimated_usage()
            cost = usage_cost(admitted.endpoint, estimated)
            try:
                if admitted.sent:
                    await broker.reconcile(admitted.grant, actual_usage(estimated, cost))
                else:
                    await broker.release(admitted.grant)
            except Exception:  # Redis is failing too: the lease expires by itself (C9)
                log.warning("a failed request's reservation was left to expire", exc_info=True)
        raise


async def grant_abandoned(call: Call, admitted: Admitted, broker: Broker) -> None:
    """C10: the client left while a non-streamed attempt ran. Its slot comes back now, not
    when its lease runs out, and its estimates stand, as after an expired lease (C9): the
    provider may have charged for what it read and wrote, and nobody will say how much."""
    estimated = admitted.estimated_usage()
    cost = usage_cost(admitted.endpoint, estimated)
    settled = await broker.reconcile(admitted.grant, actual_usage(estimated, cost))
    admitted.settled = True
    reservation_record(
        call, admitted.endpoint, admitted.grant, settled, estimated_spend=admitted.spend
    )
    call.reason = "client_disconnected"
    generation_record(call, status=499, cancelled=True)


async def answer_complete(
    call: Call, attempt: Attempt, admitted: Admitted, broker: Broker, live: LiveRouter
) -> HttpResponse:
    completion = attempt.completion
    assert completion is not None
    endpoint = admitted.endpoint
    call.ttft = call.elapsed()
    usage = completion.usage or admitted.estimated_usage()
    cost = usage_cost(endpoint, usage)
    # The answer is made before the settle, so that its generation record rides in the
    # settle's round trip (``answered_settle``); an answer that fails to render settles as before.
    try:
        result = await call.door.answer(
            admitted.request, completion, usage, _rendering(call, attempt, admitted)
        )
    except BaseException:
        await answered_settle(call, admitted, broker, usage, cost)
        raise
    responses: list[HttpResponse] = []

    def answered() -> Answered:
        admitted.learn(usage)
        broker.observe_later(admitted.buckets, attempt.limits)
        calls = [
            call_
            for choice in completion.body.get("choices") or ()
            for call_ in (choice.get("message") or {}).get("tool_calls") or ()
        ]
        answer_observe(call, live, admitted, usage, attempt.seconds, None, calls)
        call.reason = "ok"
        responses.append(json_response(result, headers=response_headers(call)))
        own = Answered()
        generation_record(
            call, status=200, usage=usage, finish_reason=completion.finish_reason, into=own
        )
        return own

    await answered_settle(call, admitted, broker, usage, cost, answered)
    return responses[0]


async def answered_settle(
    call: Call,
    admitted: Admitted,
    broker: Broker,
    usage: Usage,
    cost: float,
    answered: Callable[[], Answered] = Answered,
) -> None:
    """Settle the grant of an attempt the provider answered (C6) and record it (C8).

    ``answered`` runs once the reservation record is taken (its reason is the one before the
    answer's) and returns the answer's own ledger records: they, the reservation record and
    the pins waiting for the ledger's next append ride in the settle's round trip, the
    settle completing the reservation record with its outcome (``ledger.ledger_carry``), so an
    answer needs no append of its own (I2 holds when the settle returns).

    With Redis away the answer still counts: the provider made it and charged for it, and
    turning it into a 503 would throw it away (a job would end failed, a retry would pay
    twice). The grant is then left to its lease, which runs out and is reaped and recorded
    with its estimates standing (C9); the answer's records wait for the ledger's next append.
    A stream in steps settles after its last step landed."""
    await admitted.steps_over()
    taken = reservation_taken(
        call,
        admitted.endpoint,
        admitted.grant,
        estimated_spend=admitted.spend,
        usage=usage,
    )
    failed: Exception | None = None
    try:
        own = answered()
    except Exception as exc:  # settled all the same (as when the settle came first), then raised
        own, failed = Answered(), exc
    carry = ledger.ledger_carry(taken, own.records)
    try:
        settled = await broker.reconcile(admitted.grant, actual_usage(usage, cost), carry=carry)
    except RedisError:
        own.count()
        ledger.ledger_uncarried(carry)
        faults.warning(log, "settle:redis", "an answered request's reservation was left to expire")
        admitted.settled = True
        if failed is not None:
            raise failed from None
        return
    except BaseException:
        carry.records.clear()  # not this answer's records: the error's (the caller's guard)
        ledger.ledger_uncarried(carry)
        raise
    own.count()
    admitted.settled = True
    reservation_metrics(
        call, admitted.endpoint, usage=usage, reserved_output=admitted.reserved_output
    )
    await ledger.ledger_carried(carry, taken | reservation_settled(settled))
    if failed is not None:
        raise failed


def answer_stream(
    call: Call, attempt: Attempt, admitted: Admitted, broker: Broker, live: LiveRouter
) -> StreamingHttpResponse:
    endpoint = admitted.endpoint
    translator = attempt.adapter.stream_translator(
        response_id=call.id, model=endpoint.model_slug, created=int(call.created)
    )
    upstream_started = time.monotonic() - attempt.seconds
    upstream = attempt.stream
    assert upstream is not None
    if admitted.plan is not None:  # C10 in steps: the output grows as the tokens arrive
        admitted.steps = StreamSteps(
            admitted.plan,
            max_output=admitted.demand.output_tokens,
            reserved=admitted.first_output,
            price_output=endpoint.price_output,
            broker=broker,
            holder=admitted,
        )
    steps = admitted.steps

    async def finish(end: StreamEnd) -> None:
        call.ttft = end.ttft
        call.reason = end.reason or "ok"

        def ended() -> Answered:
            if end.usage_reported:
                admitted.learn(end.usage)
            broker.observe_later(admitted.buckets, attempt.limits)
            if end.status == 200:
                answer_observe(
                    call,
                    live,
                    admitted,
                    end.usage,
                    time.monotonic() - upstream_started,
                    end.upstream_ttft,
                    end.tool_calls,
                )
            elif end.status != 499:
                live.observe(endpoint.key, RoutingOutcome(kind="fault", latency_s=attempt.seconds))
            own = Answered()
            generation_record(
                call,
                status=end.status,
                usage=end.usage,
                finish_reason=end.finish_reason,
                cancelled=end.status == 499,
                into=own,
            )
            return own

        cost = usage_cost(endpoint, end.usage)
        await answered_settle(call, admitted, broker, end.usage, cost, ended)
        await ledger.ledger_committed()  # before the stream closes (I2)
        if end.status == 200:
            await idempotency.remember(call, 200, b"", {})
        else:  # broken or left mid-stream: nothing whole was delivered
            await idempotency.release(call)

    async def body() -> Any:
        try:
            async with broker.held(admitted.grant), grant_owned(admitted, broker):
                parts = relay(
                    upstream,
                    translator,
                    call.door.stream_renderer(
                        admitted.request, _rendering(call, attempt, admitted)
                    ),
                    estimated_input_tokens=admitted.demand.input_tokens,
                    started=call.started,
                    upstream_started=upstream_started,
                    finish=finish,
                    progress=steps.progress if steps is not None else None,
                )
                # A body closed mid-stream (the client gone) closes the relay, whose own ending
                # settles the grant, writes the ledger row and frees the Idempotency-Key.
                async with contextlib.aclosing(parts):
                    async for part in parts:
                        yield part
        except Exception:
            # Past the headers no error answer can go out; the ledger and the key still must.
            log.exception("stream %s failed unexpectedly", call.id)
            if not call.recorded:
                call.reason = "internal_error"
                generation_record(call, status=500)
            await idempotency.release(call)
            raise

    call.reason = "ok"
    response = StreamingHttpResponse(body(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    headers_add(response, response_headers(call))
    # C10: how this stream reserves its output, and what it holds as the answer starts.
    response[STREAM_RESERVATION_HEADER] = "increments" if steps is not None else "max"
    response[RESERVED_OUTPUT_HEADER] = str(admitted.reserved_output)
    return response


def answer_observe(
    call: Call,
    live: LiveRouter,
    admitted: Admitted,
    usage: Usage,
    latency: float,
    ttft: float | None,
    tool_calls: list[dict[str, Any]],
) -> None:
    """G2–G8 live stats from a good answer, and the conversation's pin (G12)."""
    endpoint = admitted.endpoint
    malformed = tool_calls_malformed(admitted.request.body.get("tools"), tool_calls)
    live.observe(
        endpoint.key,
        RoutingOutcome(
            kind="ok",
            latency_s=latency,
            ttft_s=ttft,
            input_tokens=usage.input_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            output_tokens=usage.output_tokens,
            output_checked=malformed is not None,
            output_bad=bool(malformed),
        ),
    )
    if call.conversation is not None:
        ledger.ledger_write_later(
            *live.sticky_entry(
                call.conversation,
                StickyState(endpoint.key, time.time(), usage.input_tokens + usage.output_tokens),
                ttl=endpoint.provider.cache_ttl_seconds,
            )
        )


def _rendering(call: Call, attempt: Attempt, admitted: Admitted) -> Rendering:
    endpoint = admitted.endpoint
    return Rendering(
        call_id=call.id,
        model=endpoint.model_slug,
        created=int(call.created),
        provider=endpoint.provider.name,
        cost=lambda usage: usage_cost(endpoint, usage),
        passthrough=attempt.passthrough,
    )
