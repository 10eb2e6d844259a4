"""Key names of the reservation store, shared by the Redis store and its in-memory twin.

Every key of a scope carries the scope as a Redis Cluster hash tag ``{scope}``, so all of one
scope's buckets, holders and its pause live in one slot. Only the epoch and the lease index are
global (see ``quotas/store/README.md`` for how a Cluster port splits them per slot).
"""

from __future__ import annotations

from quotas.core.model import BucketSpec, Rule

# Rules whose state is packed doubles (lua/lib.lua: one string of three for refill, fixed
# window and ramp; a hash of packed slices for a rolling window) instead of a hash of numbers:
# their keys say so (":bp:"), so that a Redis still holding the layout before's ":b:" keys (a
# deploy during traffic) is never read with the wrong layout; the scripts read such a key when
# the packed one is missing. Concurrency keeps its hash of numbers at ":b:".
PACKED_RULES = frozenset({Rule.REFILL, Rule.FIXED_WINDOW, Rule.RAMP, Rule.ROLLING_WINDOW})


def bucket_key(prefix: str, spec: BucketSpec) -> str:
    layout = "bp" if spec.rule in PACKED_RULES else "b"
    return f"{prefix}:{{{spec.scope}}}:{layout}:{spec.name}"


def legacy_bucket_key(prefix: str, spec: BucketSpec) -> str:
    """Where the layout before kept the bucket (a hash of numbers for every rule)."""
    return f"{prefix}:{{{spec.scope}}}:b:{spec.name}"


def holders_key(prefix: str, spec: BucketSpec) -> str:
    """Concurrency holders: reservation id → lease expiry (a sorted set)."""
    return f"{prefix}:{{{spec.scope}}}:b:{spec.name}:h"


def pause_key(prefix: str, scope: str) -> str:
    return f"{prefix}:{{{scope}}}:pause"


def record_key(prefix: str, scope: str, reservation_id: str) -> str:
    """The lease record lives with the reservation's first (narrowest) scope."""
    return f"{prefix}:{{{scope}}}:r:{reservation_id}"


def epoch_key(prefix: str) -> str:
    return f"{prefix}:epoch"


def lease_index_key(prefix: str) -> str:
    return f"{prefix}:leases"
