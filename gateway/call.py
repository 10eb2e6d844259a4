"""What the gateway knows about one logical request as it moves down the spine."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.decision import BucketState
from gateway.doors.base import CanonicalRequest, Door
from gateway.doors.chat import CHAT
from quotas.core.estimate import Demand
from quotas.core.model import Grant
from quotas.snapshot import Workload
from routing.catalogue import EndpointEntry, ModelEntry
from routing.core.planner import ContractReference
from tenants.identity import Principal

# Used when an app has no workload class and the configuration defines none of that name.
DEFAULT_WORKLOAD = Workload(
    name="default",
    deadline_seconds=10.0,
    max_queue_depth=100,
    overload_action="reject",
    weight=1.0,
    retry_budget=2,
)


@dataclass
class Call:
    # 32 random hex digits, as a uuid4's hex, at a third of its cost (no int, no version bits).
    id: str = field(default_factory=lambda: f"gen-{secrets.token_hex(16)}")
    started: float = field(default_factory=time.monotonic)  # monotonic, for durations
    created: float = field(default_factory=time.time)  # epoch, for deadlines and records
    door: Door = CHAT  # the protocol the client speaks: its answers and refusals are in it
    request: CanonicalRequest | None = None  # parsed once, read by every later step
    principal: Principal | None = None
    model: ModelEntry | None = None
    workload: Workload = DEFAULT_WORKLOAD
    stream: bool = False
    idempotency_key: str = ""
    # Sent to the provider as Idempotency-Key: a deferred job's id, so that a run re-sent after
    # its worker died is answered from the first (where the provider keeps keys) — E5's "each
    # line exactly once" across a SIGKILL. "" for a synchronous request.
    upstream_key: str = ""
    # The least share of its capacity any bucket had left after the last grant: for a
    # scavenger (the batch driver, E5), the pools are not idle when it is low.
    headroom: float = 1.0
    # The slot pools (concurrency buckets) the last grant held a slot in: (bucket, capacity,
    # slots left free after it). A slot is held for a whole answer, not refilled, so the batch
    # driver keeps free what other traffic's recent peak needs (gateway/batch_runner.py).
    slot_pools: tuple[tuple[str, float, float], ...] = ()
    pinned_endpoint: str = ""  # a re-run job: where its earlier run sent it (gateway/sent_pins)
    conversation: str | None = None  # G12: the conversation this request continues
    route: str = ""  # G15: why the router chose as it did
    degraded_from: str = ""  # E2: the model asked for, when its fallback served instead
    endpoint: EndpointEntry | None = None  # the endpoint of the current (or last) attempt
    grant: Grant | None = None  # the current attempt's reservation
    demand: Demand | None = None  # what it was estimated to take (C2)
    admissions: int = 0  # reservations asked for (each has its own id)
    run: int = 0  # a deferred job's run (its tries): a re-run never reuses a dead run's ids
    # A deferred job's try that, refused for capacity, waits and tries again (not its last).
    retried_later: bool = False
    bucket_states: list[BucketState] = field(default_factory=list)  # tenant side, for H1
    binding_bucket: str = ""  # public name of the bucket that refused (H1)
    shadow_refusals: list[str] = field(default_factory=list)  # trial limits that would refuse
    queue_id: str = ""
    attempts: int = 0  # upstream attempts made (F4 budget: attempts − 1 retries)
    queue_wait: float = 0.0  # seconds spent waiting for capacity
    # The tokens (in, out) the plan priced the request at: what admission tells the router of
    # the broker's refusals (routing.core.scarcity).
    planned: tuple[float, float] = (0.0, 0.0)
    ttft: float | None = None
    reason: str = ""  # Switchyard's reason code for the outcome
    explanation: list[str] = field(default_factory=list)  # why endpoints were passed over
    # One entry per attempt, for the ledger's timeline: provider, model, outcome, durations (ms).
    timeline: list[dict[str, Any]] = field(default_factory=list)
    broken: frozenset[str] = frozenset()  # endpoints planned behind an open breaker (G7)
    # F5: fallbacks the route's contract kept out of the plan, (endpoint id, clause).
    contract_refused: tuple[tuple[str, str], ...] = ()
    # F5: the first route's contract and first choice, which a degraded re-plan keeps to.
    contract_reference: ContractReference | None = None
    recorded: bool = False  # its generation (ledger row) was written

    @property
    def may_degrade(self) -> bool:
        """E2: refused for capacity, this request may go to its model's fallback (once)."""
        return (
            self.workload.overload_action == "degrade"
            and not self.degraded_from
            and self.model is not None
            and self.model.fallback_slug is not None
        )

    @property
    def deadline(self) -> float:
        return self.created + self.workload.deadline_seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.started
