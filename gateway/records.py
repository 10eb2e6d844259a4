"""What the ledger keeps of a request (one ``generation``) and of each reservation (C8)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway import ledger, metrics
from gateway.call import Call
from gateway.providers.base import Usage
from quotas.core.model import Grant, Reason, ReconcileResult, Refusal
from routing.catalogue import EndpointEntry


def usage_cost(endpoint: EndpointEntry, usage: Usage) -> float:
    """USD the provider charges for ``usage`` (cached input at the cached price)."""
    return round(
        endpoint.cost(
            input_tokens=usage.input_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            output_tokens=usage.output_tokens,
        ),
        10,
    )


@dataclass
class Answered:
    """An answer's ledger records held for its settle's round trip (``answers.answered_settle``):
    they count (metrics, ``call.recorded``) only once the settle took them or failed in Redis;
    if the settle raises anything else, the answer is not what the client gets, so they go."""

    records: list[dict[str, Any]] = field(default_factory=list)
    counts: list[Callable[[], None]] = field(default_factory=list)

    def count(self) -> None:
        for counted in self.counts:
            counted()


def generation_record(
    call: Call,
    *,
    status: int,
    usage: Usage | None = None,
    finish_reason: str = "",
    cancelled: bool = False,
    into: Answered | None = None,
) -> None:
    """The request's ``generation`` record, queued for the ledger's next append, or held
    ``into`` an answer's records for its settle (then counted when they are)."""
    principal = call.principal
    if principal is None:  # unauthenticated: nobody to charge, nothing to record
        return
    usage = usage or Usage()
    endpoint = call.endpoint
    demand = call.demand
    model = endpoint.model_slug if endpoint else (call.model.slug if call.model else "")
    provider = endpoint.provider.name if endpoint else ""
    reason = call.reason

    def count() -> None:
        call.recorded = True
        metrics.child(
            metrics.REQUESTS,
            principal.tenant_name,
            model,
            provider,
            call.workload.name,
            str(status),
            reason,
            call.door.name,
        ).inc()
        metrics.child(metrics.QUEUE_WAIT, principal.tenant_name, call.workload.name).observe(
            call.queue_wait
        )
        if call.attempts:
            metrics.child(metrics.RETRIES, call.workload.name).observe(call.attempts)
        if endpoint:
            usage_metrics(call, endpoint, usage)

    record = {
        "kind": "generation",
        "id": call.id,
        "created_at": call.created,
        "tenant_id": principal.tenant_id,
        "team_id": principal.team_id,
        "app_id": principal.app_id,
        "api_key_id": principal.key_id,
        "workload_class": call.workload.name,
        "model": model,
        "provider": endpoint.provider.name if endpoint else "",
        "upstream_model": endpoint.upstream_model if endpoint else "",
        "status": status,
        "reason_code": call.reason,
        "finish_reason": finish_reason or "",
        "streamed": call.stream,
        "cancelled": cancelled,
        "input_tokens": usage.input_tokens,
        "cached_input_tokens": usage.cached_input_tokens,
        "output_tokens": usage.output_tokens,
        "estimated_input_tokens": demand.input_tokens if demand else 0,
        "estimated_output_tokens": demand.output_tokens if demand else 0,
        "cost": usage_cost(endpoint, usage) if endpoint else 0.0,
        "latency_ms": call.elapsed() * 1000,
        "ttft_ms": call.ttft * 1000 if call.ttft is not None else None,
        "attempts": call.attempts,
        "detail": {
            "explanation": call.explanation,
            "route": call.route,
            "shadow_refusals": call.shadow_refusals,
            "queue_wait_ms": round(call.queue_wait * 1000, 1),
            "degraded_from": call.degraded_from,
            "attempts": call.timeline,
            "door": call.door.name,
        },
    }
    if into is not None:
        into.records.append(record)
        into.counts.append(count)
    else:
        count()
        ledger.ledger_record_later("generation", record)


def usage_metrics(call: Call, endpoint: EndpointEntry, usage: Usage) -> None:
    """H2: latency by model and provider, usage and cost by tenant and app."""
    principal = call.principal
    assert principal is not None
    model, provider = endpoint.model_slug, endpoint.provider.name
    metrics.child(metrics.REQUEST_DURATION, model, provider).observe(call.elapsed())
    if call.ttft is not None:
        metrics.child(metrics.TTFT, model, provider).observe(call.ttft)
    tenant, app = principal.tenant_name, principal.app_name
    for kind, tokens in (
        ("input", usage.input_tokens),
        ("cached_input", usage.cached_input_tokens),
        ("output", usage.output_tokens),
    ):
        if tokens:
            metrics.child(metrics.TOKENS, tenant, app, kind).inc(tokens)
    cost = usage_cost(endpoint, usage)
    if cost:
        metrics.child(metrics.COST, tenant, app).inc(cost)


def reservation_record(
    call: Call,
    endpoint: EndpointEntry,
    grant: Grant,
    result: ReconcileResult,
    *,
    estimated_spend: float,
    usage: Usage | None = None,
    reserved_output: int | None = None,
) -> None:
    """C8: a reservation as it was taken and settled (``reserved_output``: what a stream in
    steps held at its end, when it is not the demand's output)."""
    record = reservation_taken(
        call,
        endpoint,
        grant,
        estimated_spend=estimated_spend,
        usage=usage,
    )
    reservation_metrics(call, endpoint, usage=usage, reserved_output=reserved_output)
    ledger.ledger_record_later("reservation", record | reservation_settled(result))


def reservation_metrics(
    call: Call,
    endpoint: EndpointEntry,
    *,
    usage: Usage | None = None,
    reserved_output: int | None = None,
) -> None:
    """How far the estimates were from the usage, once a reservation is settled."""
    demand = call.demand
    assert demand is not None
    if usage is not None and demand.raw_input_tokens:
        metrics.child(metrics.ESTIMATE_RATIO, endpoint.model_slug).observe(
            usage.input_tokens / max(1, demand.input_tokens)
        )
        output = demand.output_tokens if reserved_output is None else reserved_output
        metrics.child(metrics.OVER_RESERVED, endpoint.model_slug).inc(
            max(0, demand.input_tokens + output - usage.total_tokens)
        )


def reservation_settled(result: ReconcileResult) -> dict[str, Any]:
    """A reservation record's settlement: its outcome and what each bucket gave back or was
    charged (queue_settle.lua writes the same fields when the settle carries the record)."""
    return {
        "outcome": result.outcome.value,
        "settled": {
            s.bucket: {"released": s.released, "charged": s.charged} for s in result.settlements
        },
    }


def reservation_taken(
    call: Call,
    endpoint: EndpointEntry,
    grant: Grant,
    *,
    estimated_spend: float,
    usage: Usage | None = None,
) -> dict[str, Any]:
    """A reservation record without its settlement (``reservation_settled``)."""
    principal = call.principal
    assert principal is not None and call.demand is not None
    demand = call.demand
    return {
        "kind": "reservation",
        "id": grant.reservation_id,
        "request_id": call.id,
        "idempotency_key": call.idempotency_key[:200],  # the ledger column's width
        "created_at": grant.created_at,
        "expires_at": grant.expires_at,
        "queue_deadline": call.deadline,
        "tenant_id": principal.tenant_id,
        "app_id": principal.app_id,
        "api_key_id": principal.key_id,
        "model": endpoint.model_slug,
        "provider": endpoint.provider.name,
        "workload_class": call.workload.name,
        "estimated_input_tokens": demand.input_tokens,
        "estimated_output_tokens": demand.output_tokens,
        "estimated_total_tokens": demand.total_tokens,
        "estimated_spend": estimated_spend,
        "taken": grant.taken(),
        "reason_code": call.reason,
        "queue_wait_ms": call.queue_wait * 1000,
        "actual_input_tokens": usage.input_tokens if usage else None,
        "actual_cached_input_tokens": usage.cached_input_tokens if usage else None,
        "actual_output_tokens": usage.output_tokens if usage else None,
        "actual_spend": usage_cost(endpoint, usage) if usage else None,
    }


def refusal_record(call: Call, refusal: Refusal) -> None:
    """C8: the broker's refusal, so the ledger shows what was asked and why it was not given."""
    principal = call.principal
    metrics.child(metrics.REFUSALS, refusal.bucket, refusal.reason.value).inc()
    if principal is None or call.demand is None:
        return
    if call.retried_later and refusal.reason is not Reason.UNSATISFIABLE:
        # A deferred job's try that waits and comes back is no row of its own: a 10,000-line
        # batch on a busy pool would write tens of thousands. The metric above counts it,
        # the job its tries; its last try's refusal is the row.
        return
    ledger.ledger_record_later(
        "reservation",
        {
            "id": refusal.reservation_id,
            "request_id": call.id,
            "idempotency_key": call.idempotency_key[:200],  # the ledger column's width
            "created_at": refusal.at,
            "queue_deadline": call.deadline,
            "tenant_id": principal.tenant_id,
            "app_id": principal.app_id,
            "api_key_id": principal.key_id,
            "model": call.model.slug if call.model else "",
            "workload_class": call.workload.name,
            "estimated_input_tokens": call.demand.input_tokens,
            "estimated_output_tokens": call.demand.output_tokens,
            "estimated_total_tokens": call.demand.total_tokens,
            "outcome": "refused",
            "reason_code": f"{refusal.reason.value}:{refusal.bucket}",
            "queue_wait_ms": call.queue_wait * 1000,
        },
    )
