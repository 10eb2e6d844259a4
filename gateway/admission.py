"""Admission (SPEC C2–C4, D1, E1–E6): estimate, then reserve on the best candidate with room.

Candidates come ranked from the router. Each is tried with one reservation (one Redis round
trip); a provider-side refusal moves on to the next candidate, a refusal by the caller's own
bucket ends the search (it binds on every endpoint). When nothing fits now, the request waits
for the candidate that will have room first — until its workload's deadline — or is refused
with the reason, the binding bucket and ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from gateway import metrics
from gateway.call import Call
from gateway.decision import BucketState, reset_seconds
from gateway.errors import CapacityRefused
from gateway.providers.base import Usage
from gateway.records import refusal_record
from gateway.snapshot import Snapshot
from quotas.broker import AttemptBuckets, Broker, attempt_buckets, demand_usage
from quotas.core.estimate import Corrections, Demand, demand_estimate
from quotas.core.model import Grant, Reason, Refusal
from routing.catalogue import EndpointEntry

# Estimation corrections learned by this process from its own reconciliations (C11).
CORRECTIONS = Corrections()


@dataclass
class Admitted:
    endpoint: EndpointEntry
    buckets: AttemptBuckets
    grant: Grant
    demand: Demand
    body: dict[str, Any]

    def estimated_usage(self) -> Usage:
        return Usage(input_tokens=self.demand.input_tokens, output_tokens=self.demand.output_tokens)

    @property
    def spend(self) -> float:
        """The estimated spend this reservation took (at the endpoint's uncached prices)."""
        return self.demand.spend(
            price_input=self.endpoint.price_input, price_output=self.endpoint.price_output
        )

    def learn(self, usage: Usage) -> None:
        CORRECTIONS.learn(
            self.demand.estimation,
            raw_input=self.demand.raw_input_tokens,
            actual_input=usage.input_tokens,
        )


@dataclass
class Candidate:
    endpoint: EndpointEntry
    buckets: AttemptBuckets
    demand: Demand
    refusal: Refusal


async def admit(
    call: Call,
    snapshot: Snapshot,
    body: dict[str, Any],
    candidates: list[EndpointEntry],
    broker: Broker,
) -> Admitted:
    assert call.principal is not None
    refused: list[Candidate] = []
    for endpoint in candidates:
        model = snapshot.catalogue.models[endpoint.model_slug]
        demand = demand_estimate(
            body,
            model=model.slug,
            route=endpoint.provider.name,
            default_output_tokens=model.default_output_tokens,
            max_output=endpoint.max_output,
            corrections=CORRECTIONS,
        )
        buckets = attempt_buckets(snapshot.quotas, call.principal, endpoint, model.id)
        result = await broker.admit(_reservation_id(call), buckets, demand_usage(demand, endpoint))
        if isinstance(result, Grant):
            return _admitted(call, endpoint, buckets, result, demand, body)
        refused.append(Candidate(endpoint, buckets, demand, result))
        call.explanation.append(f"{endpoint.provider.name}:{result.reason}")
        if buckets.is_tenant_side(result.bucket):
            break  # the caller's own limit binds whichever endpoint serves the request
    return await _wait(call, body, refused, broker)


async def _wait(
    call: Call, body: dict[str, Any], refused: list[Candidate], broker: Broker
) -> Admitted:
    """Wait for the candidate that fits first, until the deadline; else refuse (E6)."""
    waiting_since = time.monotonic()
    best = min(refused, key=lambda c: c.refusal.retry_at)
    try:
        while True:
            refusal = best.refusal
            if refusal.reason is Reason.UNSATISFIABLE or refusal.retry_at > call.deadline:
                raise _refusal(call, refusal, best.demand)
            await asyncio.sleep(max(0.0, refusal.retry_at - time.time()))
            result = await broker.admit(
                _reservation_id(call), best.buckets, demand_usage(best.demand, best.endpoint)
            )
            if isinstance(result, Grant):
                return _admitted(call, best.endpoint, best.buckets, result, best.demand, body)
            best.refusal = result
    finally:
        call.queue_wait += time.monotonic() - waiting_since


def _admitted(
    call: Call,
    endpoint: EndpointEntry,
    buckets: AttemptBuckets,
    grant: Grant,
    demand: Demand,
    body: dict[str, Any],
) -> Admitted:
    call.grant, call.demand = grant, demand
    for shadow in grant.shadow_refusals:  # B: a trial limit is counted, never enforced
        call.shadow_refusals.append(f"{shadow.bucket}:{shadow.reason.value}")
        metrics.SHADOW_REFUSALS.labels(shadow.bucket).inc()
    call.bucket_states = [
        BucketState(
            bucket, part.remaining, reset_seconds(bucket.spec, part.remaining, grant.created_at)
        )
        for bucket, part in zip(buckets.buckets, grant.parts, strict=True)
        if bucket.tenant_side and part.remaining is not None
    ]
    return Admitted(endpoint, buckets, grant, demand, body)


def _refusal(call: Call, refusal: Refusal, demand: Demand) -> CapacityRefused:
    call.binding_bucket = refusal.bucket
    call.demand = demand
    refusal_record(call, refusal)
    retry_after = max(0.0, refusal.retry_at - time.time())
    if refusal.reason is Reason.UNSATISFIABLE:
        message = (
            f"This request needs more than the whole capacity of '{refusal.bucket}'; "
            "it can never be admitted. Ask for fewer tokens."
        )
        retry = None
    else:
        message = (
            f"No capacity before this request's deadline: '{refusal.bucket}' is "
            f"{refusal.reason.value.replace('_', ' ')}."
        )
        retry = retry_after
    return CapacityRefused(message, reason=refusal.reason.value, retry_after=retry)


def _reservation_id(call: Call) -> str:
    call.admissions += 1
    return f"{call.id}:{call.admissions}"
