"""Admission (SPEC C2–C4, D1, E1–E6): estimate, then reserve on the best candidate with room.

Candidates come ranked from the router. Each is tried with one reservation (one Redis round
trip); a provider-side refusal moves on to the next candidate, a refusal by the caller's own
bucket ends the search (it binds on every endpoint). When nothing fits now, the request waits
for the candidate that will have room first — until its workload's deadline — or is refused
with the reason, the binding bucket and ``Retry-After``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from gateway import metrics
from gateway.call import Call
from gateway.decision import BucketState, reset_seconds
from gateway.doors.base import CanonicalRequest
from gateway.errors import CapacityRefused
from gateway.providers.base import Usage
from gateway.records import refusal_record
from gateway.snapshot import Snapshot
from gateway.steps import StreamSteps
from quotas.broker import AttemptBuckets, Broker, Turn, attempt_buckets, demand_usage
from quotas.core.estimate import Corrections, Demand
from quotas.core.fairqueue import (
    QueueReason,
    QueueRefusal,
    refusal_floor,
    request_cost,
    scarce_buckets,
)
from quotas.core.increments import StepPlan
from quotas.core.model import Grant, Reason, Refusal, Rule
from quotas.core.model import Usage as QuotaUsage
from routing.catalogue import CredentialEntry, EndpointEntry
from routing.core.capacity import CapacityView
from routing.core.router import Router
from routing.live import live_router

# Estimation corrections learned by this process from its own reconciliations (C11).
CORRECTIONS = Corrections()
# A tenant's flow may fill at most this share of a pool's queue (the rest stays for others).
FLOW_SHARE_OF_QUEUE = 0.5
QUEUE_REFUSALS = {
    "deadline": "it waited in the queue until its deadline",
    "deadline_unreachable": "capacity will not come back before its deadline",
    "queue_full": "the queue for this provider is full",
    "flow_full": "this tenant already has as many requests waiting as it may",
    "cancelled": "it was cancelled while waiting",
    "abandoned": "its gateway process stopped reading while it waited",
}


@dataclass
class Admitted:
    endpoint: EndpointEntry
    buckets: AttemptBuckets
    grant: Grant
    demand: Demand
    request: CanonicalRequest
    # C10: a stream of a class that reserves its output in steps — the plan, and the output
    # the grant took at admission (its first step; else the demand's whole output).
    plan: StepPlan | None = None
    first_output: int = 0
    steps: StreamSteps | None = None  # the steps taken as the stream runs (``answer_stream``)
    sent: bool = False  # the provider may have received this attempt's call
    settled: bool = False  # reconciled or released: the guard in the pipeline has nothing to do

    def mark_sent(self) -> None:
        self.sent = True

    @property
    def reserved_output(self) -> int:
        """Output tokens the grant holds: the demand's, or in steps the first and those since."""
        return self.steps.reserved if self.steps is not None else self.first_output

    def reserved_usage(self) -> QuotaUsage:
        """What the grant holds in every dimension (``demand_usage`` at the reserved output)."""
        demand = dataclasses.replace(self.demand, output_tokens=self.reserved_output)
        return demand_usage(demand, self.endpoint)

    async def steps_over(self) -> None:
        """Before the grant is settled: no further step, and the one in flight landed."""
        if self.steps is not None:
            await self.steps.drain()

    @property
    def api_key(self) -> str:
        """The provider key this attempt is sent with (its pool's chosen key, B2)."""
        credential = self.buckets.credential
        return credential.api_key if credential is not None else self.endpoint.provider.api_key

    def estimated_usage(self) -> Usage:
        return Usage(input_tokens=self.demand.input_tokens, output_tokens=self.reserved_output)

    @property
    def spend(self) -> float:
        """The estimated spend this reservation took (at the endpoint's uncached prices)."""
        return dataclasses.replace(self.demand, output_tokens=self.reserved_output).spend(
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
    refusal: Refusal | QueueRefusal


async def admit(
    call: Call,
    snapshot: Snapshot,
    request: CanonicalRequest,
    candidates: list[EndpointEntry],
    broker: Broker,
) -> Admitted:
    """Try the ranked candidates without waiting; then wait in line for the first to fit."""
    assert call.principal is not None
    refused: list[Candidate] = []
    router = live_router().router
    capacity = router.capacity
    for endpoint in candidates:
        model = snapshot.catalogue.models[endpoint.model_slug]
        demand = request.estimate.demand(
            model=model.slug,
            route=endpoint.provider.name,
            default_output_tokens=model.default_output_tokens,
            max_output=endpoint.max_output,
            corrections=CORRECTIONS,
        )
        usage = reserved_usage(call, demand, endpoint)
        tenant_bound = False
        # B2: the provider's keys in a room-weighted shuffle; a key whose own bucket (or its
        # project's) refuses leaves the next key a chance, any wider refusal ends the pool.
        for credential in broker.key_order(endpoint.provider, time.time()):
            buckets = attempt_buckets(
                snapshot.quotas, call.principal, endpoint, model.id, credential
            )
            turn = _turn(call, demand, endpoint, wait=False)
            result = await _reserve(call, broker, buckets, usage, turn)
            if isinstance(result, Grant):
                broker.key_granted(buckets, result, time.time())
                capacity.room(endpoint.key)
                router.scarcity_granted(endpoint.key, buckets.provider_scope, time.time())
                return _admitted(call, endpoint, buckets, result, demand, request)
            refused.append(Candidate(endpoint, buckets, demand, result))
            call.explanation.append(f"{attempt_label(endpoint, credential)}:{result.reason.value}")
            if buckets.is_tenant_side(result.bucket):
                tenant_bound = True
                break
            if not buckets.is_key_side(result.bucket):
                break
            broker.key_full(buckets, result.retry_at, time.time())
        if tenant_bound:
            break  # the caller's own limit binds whichever endpoint serves the request
        _capacity_heard(capacity, endpoint, buckets, result, request.estimate.input_tokens)
        _scarcity_heard(router, call, endpoint, buckets, result)

    return await _wait(call, request, refused, broker)


def stream_plan(call: Call) -> StepPlan | None:
    """C10: how this request's output is reserved in steps (None: all of it at once, as every
    non-streamed request and every stream of a class that reserves the maximum)."""
    return call.workload.step_plan if call.stream else None


def reserved_usage(call: Call, demand: Demand, endpoint: EndpointEntry) -> QuotaUsage:
    """What an attempt reserves: the demand, or for a stream in steps the demand with its
    output (and the spend that output costs) cut to the first step — and its whole output still
    for the provider's buckets that count ``max_tokens`` (``Usage.output_max``)."""
    plan = stream_plan(call)
    if plan is None:
        return demand_usage(demand, endpoint)
    most = demand.output_tokens
    demand = dataclasses.replace(demand, output_tokens=plan.first_step(most))
    return dataclasses.replace(demand_usage(demand, endpoint), output_max=float(most))


def attempt_label(endpoint: EndpointEntry, credential: CredentialEntry | None) -> str:
    """``alpha`` or, for a pooled key, ``alpha/key-2`` (the explanation's words)."""
    if credential is None or credential.id is None:
        return endpoint.provider.name
    return f"{endpoint.provider.name}/{credential.name}"


async def _wait(
    call: Call, request: CanonicalRequest, refused: list[Candidate], broker: Broker
) -> Admitted:
    """Wait in the fair queue of the candidate that fits first, until the deadline (D2, E6)."""
    best = min(refused, key=lambda c: c.refusal.retry_at)
    if best.refusal.reason is Reason.UNSATISFIABLE or call.may_degrade:
        # A degrading class does not wait here: its fallback model may have room now (E2).
        raise _refusal(call, best.refusal, best.demand, best.buckets)
    waiting_since = time.monotonic()
    try:
        result = await _reserve(
            call,
            broker,
            best.buckets,
            reserved_usage(call, best.demand, best.endpoint),
            _turn(call, best.demand, best.endpoint, wait=True),
        )
    finally:
        call.queue_wait += time.monotonic() - waiting_since
    if isinstance(result, Grant):
        live_router().router.capacity.room(best.endpoint.key)
        return _admitted(call, best.endpoint, best.buckets, result, best.demand, request)
    raise _refusal(call, result, best.demand, best.buckets)


def _capacity_heard(
    capacity: CapacityView,
    endpoint: EndpointEntry,
    buckets: AttemptBuckets,
    refusal: QueueRefusal,
    size: float,
) -> None:
    """Tell this process's router when the endpoint's provider fits again (issue 17 item 3):
    the answer the broker just gave, so the view costs no Redis call, for requests of at least
    this one's ``size`` (its estimated input tokens, as the router saw them). Only the
    provider's own buckets count: a tenant's limit binds on every endpoint alike."""
    provider = [b.spec for b in buckets.buckets if not b.tenant_side]
    floor = refusal_floor(refusal, provider, refusal.at)
    capacity.full(endpoint.key, floor, refusal.at, float(size))


def _scarcity_heard(
    router: Router,
    call: Call,
    endpoint: EndpointEntry,
    buckets: AttemptBuckets,
    refusal: QueueRefusal,
) -> None:
    """Tell this process's router which of the provider's buckets refused a fast try, and for
    a request the plan priced at what (``routing.core.scarcity``): its shadow prices come
    from the broker's answers admission already has, no Redis call. A tenant's own limit or
    a pause says nothing of the provider's scarcity (``scarce_buckets``: None)."""
    provider = [b.spec for b in buckets.buckets if not b.tenant_side]
    scarce = scarce_buckets(refusal, provider)
    if scarce is None:
        return
    planned_in, planned_out = call.planned
    router.scarcity_refused(
        endpoint.key,
        buckets.provider_scope,
        refusal.at,
        scarce,
        input_tokens=planned_in,
        output_tokens=planned_out,
    )


def _turn(call: Call, demand: Demand, endpoint: EndpointEntry, *, wait: bool) -> Turn:
    """The request's place in a pool's fair queue: its flow, weight, deadline, depth — and,
    for a stream in steps, its cost: its whole estimate, not the first step it reserves."""
    assert call.principal is not None
    workload = call.workload
    depth = workload.max_queue_depth if wait else 0
    cost = request_cost(demand_usage(demand, endpoint)) if stream_plan(call) else None
    return Turn(
        # One flow per tenant and class, so a tenant's batch work never queues ahead of its
        # own interactive requests; the weight is class × tenant (D2).
        flow=f"{call.principal.tenant_id}/{workload.name}",
        weight=workload.weight * call.principal.tenant_weight,
        deadline=call.deadline,
        max_depth=depth,
        flow_depth=max(1, math.ceil(depth * FLOW_SHARE_OF_QUEUE)) if wait else 0,
        cost=cost,
    )


def _admitted(
    call: Call,
    endpoint: EndpointEntry,
    buckets: AttemptBuckets,
    grant: Grant,
    demand: Demand,
    request: CanonicalRequest,
) -> Admitted:
    call.grant, call.demand = grant, demand
    for shadow in grant.shadow_refusals:  # B: a trial limit is counted, never enforced
        call.shadow_refusals.append(f"{shadow.bucket}:{shadow.reason.value}")
        metrics.child(metrics.SHADOW_REFUSALS, shadow.bucket).inc()
    call.bucket_states = [
        BucketState(
            bucket, part.remaining, reset_seconds(bucket.spec, part.remaining, grant.created_at)
        )
        for bucket, part in zip(buckets.buckets, grant.parts, strict=True)
        if bucket.tenant_side and part.remaining is not None
    ]
    call.headroom = min(
        (
            part.remaining / bucket.spec.capacity
            for bucket, part in zip(buckets.buckets, grant.parts, strict=True)
            if part.remaining is not None
            and bucket.spec.capacity > 0
            and bucket.spec.rule is not Rule.RAMP
            and not bucket.spec.shadow
        ),
        default=1.0,
    )
    call.slot_pools = tuple(
        (bucket.spec.name, bucket.spec.capacity, part.remaining)
        for bucket, part in zip(buckets.buckets, grant.parts, strict=True)
        if bucket.spec.rule is Rule.CONCURRENCY
        and part.remaining is not None
        and bucket.spec.capacity > 0
        and not bucket.spec.shadow
    )
    plan = stream_plan(call)
    first = plan.first_step(demand.output_tokens) if plan is not None else demand.output_tokens
    return Admitted(endpoint, buckets, grant, demand, request, plan=plan, first_output=first)


def _refusal(
    call: Call, refusal: Refusal | QueueRefusal, demand: Demand, buckets: AttemptBuckets
) -> CapacityRefused:
    call.binding_bucket = refusal.bucket
    call.queue_id = getattr(refusal, "queue_id", "")
    call.demand = demand
    # H1: the caller's own limit that refused is described as a served request's would be
    # (nothing left until it fits again); a shared pool's level is not the caller's to see.
    binding = next(
        (b for b in buckets.buckets if b.tenant_side and b.spec.name == refusal.bucket), None
    )
    if binding is not None:
        until = refusal.retry_at - refusal.at
        reset = until if math.isfinite(until) else reset_seconds(binding.spec, 0.0, refusal.at)
        call.bucket_states = [BucketState(binding, 0.0, max(0.0, reset))]
    refusal_record(call, refusal)
    reason = refusal.reason.value
    if refusal.reason is Reason.UNSATISFIABLE:
        return CapacityRefused(
            f"This request needs more than the whole capacity of '{refusal.bucket}'; "
            "it can never be admitted. Ask for fewer tokens.",
            reason=reason,
            retry_after=None,
        )
    # Retry-After is never below one second (a refusal is never an invitation to spin).
    retry_after = (
        max(1.0, refusal.retry_at - time.time()) if math.isfinite(refusal.retry_at) else None
    )
    if refusal.reason is Reason.RECOVERING:
        why = (
            f"the limit '{refusal.bucket}' is recovering: the broker's Redis state is new or was "
            "lost, and the gateway processes are re-registering the requests in flight"
        )
    elif refusal.bucket and refusal.reason is QueueReason.DEADLINE_UNREACHABLE:
        why = f"the limit '{refusal.bucket}' will not have room for it before its deadline"
    elif refusal.bucket:
        why = f"the limit '{refusal.bucket}' is {reason.replace('_', ' ')}"
    else:
        why = QUEUE_REFUSALS.get(reason, reason.replace("_", " "))
    return CapacityRefused(
        f"No capacity for this request: {why}.", reason=reason, retry_after=retry_after
    )


def capacity_wait_refusal(call: Call, endpoint: str, wait: float) -> CapacityRefused:
    """Every candidate is full past the request's deadline, as the broker last said: refused
    before any broker call, naming the endpoint with room first (issue 17 item 3)."""
    call.binding_bucket = ""
    return CapacityRefused(
        f"No capacity for this request: every endpoint that can serve it is full past its "
        f"deadline; the first to have room is '{endpoint}', in about {wait:.0f} s.",
        reason="capacity_wait",
        retry_after=max(1.0, wait),
    )


async def _reserve(
    call: Call, broker: Broker, buckets: AttemptBuckets, usage: QuotaUsage, turn: Turn
) -> Grant | QueueRefusal:
    result = await broker.admit(_reservation_id(call), buckets, usage, turn)
    if isinstance(result, Grant) and result.replayed and result.state != "active":
        # That id's reservation is over (expired, settled): it holds nothing, so it is no
        # grant to dispatch on; ask again under a new id.
        result = await broker.admit(_reservation_id(call), buckets, usage, turn)
    return result


def _reservation_id(call: Call) -> str:
    """Unique per request and run: a job's re-run after its worker died must not meet the dead
    run's (expired) reservation again, replayed as if it were a grant that still holds."""
    call.admissions += 1
    if call.run:
        return f"{call.id}:{call.run}.{call.admissions}"
    return f"{call.id}:{call.admissions}"
