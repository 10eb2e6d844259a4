"""What the ledger keeps of a request (one ``generation``) and of each reservation (C8)."""

from __future__ import annotations

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


def generation_record(
    call: Call,
    *,
    status: int,
    usage: Usage | None = None,
    finish_reason: str = "",
    cancelled: bool = False,
) -> None:
    principal = call.principal
    if principal is None:  # unauthenticated: nobody to charge, nothing to record
        return
    call.recorded = True
    usage = usage or Usage()
    endpoint = call.endpoint
    demand = call.demand
    model = endpoint.model_slug if endpoint else (call.model.slug if call.model else "")
    provider = endpoint.provider.name if endpoint else ""
    metrics.child(
        metrics.REQUESTS,
        principal.tenant_name,
        model,
        provider,
        call.workload.name,
        str(status),
        call.reason,
        call.door.name,
    ).inc()
    metrics.child(metrics.QUEUE_WAIT, principal.tenant_name, call.workload.name).observe(
        call.queue_wait
    )
    if call.attempts:
        metrics.child(metrics.RETRIES, call.workload.name).observe(call.attempts)
    if endpoint:
        usage_metrics(call, endpoint, usage)
    ledger.ledger_record_later(
        "generation",
        {
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
        },
    )


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
    principal = call.principal
    assert principal is not None and call.demand is not None
    demand = call.demand
    if usage is not None and demand.raw_input_tokens:
        metrics.child(metrics.ESTIMATE_RATIO, endpoint.model_slug).observe(
            usage.input_tokens / max(1, demand.input_tokens)
        )
        output = demand.output_tokens if reserved_output is None else reserved_output
        metrics.child(metrics.OVER_RESERVED, endpoint.model_slug).inc(
            max(0, demand.input_tokens + output - usage.total_tokens)
        )
    ledger.ledger_record_later(
        "reservation",
        {
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
            "outcome": result.outcome.value,
            "reason_code": call.reason,
            "queue_wait_ms": call.queue_wait * 1000,
            "actual_input_tokens": usage.input_tokens if usage else None,
            "actual_cached_input_tokens": usage.cached_input_tokens if usage else None,
            "actual_output_tokens": usage.output_tokens if usage else None,
            "actual_spend": usage_cost(endpoint, usage) if usage else None,
            "settled": {
                s.bucket: {"released": s.released, "charged": s.charged} for s in result.settlements
            },
        },
    )


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
