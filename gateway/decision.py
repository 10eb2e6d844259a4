"""Decision metadata on every response, success or refusal (SPEC H1, E4, E6).

- ``RateLimit-Policy`` / ``RateLimit`` in the IETF draft's structured-field syntax
  (draft-ietf-httpapi-ratelimit-headers: ``"name";q=…;w=…`` and ``"name";r=…;t=…``),
- OpenAI-style ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the tightest
  tenant-side bucket of each kind, so SDKs that read them keep working,
- ``Retry-After`` on every refusal, and Switchyard's own ``x-switchyard-*`` fields: reason
  code, binding bucket, queue id and wait, attempts, workload class.

Only the caller's own buckets appear (key, app, team, tenant), by their public names — never
another tenant's usage, never provider credentials. A partner's bucket is shared with sibling
tenants, so its level would tell one tenant about another's traffic: it is named when it
refuses, but its remaining capacity is never published.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from quotas.core.model import BucketSpec, Dimension, Rule
from quotas.core.windows import BoundaryCache, window_of
from quotas.snapshot import ScopedBucket

OWN_SCOPES = frozenset({"api_key", "app", "team", "tenant"})
REQUEST_DIMENSIONS = (Dimension.REQUESTS,)
TOKEN_DIMENSIONS = (Dimension.TOTAL_TOKENS, Dimension.INPUT_TOKENS, Dimension.OUTPUT_TOKENS)


@dataclass(frozen=True, slots=True)
class BucketState:
    """One tenant-side bucket as the caller may see it after the decision."""

    bucket: ScopedBucket
    remaining: float
    reset_seconds: float  # until it is full again (refill) or resets (windows)


_BOUNDARIES = BoundaryCache()


def reset_seconds(spec: BucketSpec, remaining: float, now: float) -> float:
    """Until the bucket is full again (refill, rolling) or starts afresh (fixed window, ramp)."""
    if spec.rule is Rule.REFILL:
        return max(0.0, spec.capacity - remaining) * spec.period / spec.capacity
    if spec.rule is Rule.FIXED_WINDOW and spec.window is not None:
        bounds = _BOUNDARIES.numbers(spec, now)  # zoneinfo arithmetic once per window, not per call
        return window_of(bounds, now)[1] - now
    if spec.rule is Rule.ROLLING_WINDOW:
        return spec.period if remaining < spec.capacity else 0.0
    if spec.rule is Rule.RAMP:
        return spec.period - now % spec.period
    return 0.0  # concurrency: a slot comes back when a request ends


def decision_headers(
    *,
    reason: str,
    workload: str,
    attempts: int,
    queue_wait: float,
    states: list[BucketState],
    binding_bucket: str = "",
    retry_after: float | None = None,
    queue_id: str = "",
) -> dict[str, str]:
    headers = {
        "x-switchyard-reason": reason,
        "x-switchyard-workload": workload,
        "x-switchyard-attempts": str(attempts),
        "x-switchyard-queue-wait-ms": str(round(queue_wait * 1000)),
    }
    visible = [s for s in states if s.bucket.scope_kind in OWN_SCOPES and not s.bucket.spec.shadow]
    tightest = _tightest(visible)
    if binding_bucket:
        headers["x-switchyard-bucket"] = binding_bucket
    elif tightest is not None:
        headers["x-switchyard-bucket"] = tightest.bucket.spec.name
    if queue_id:
        headers["x-switchyard-queue-id"] = queue_id
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    if visible:
        headers["RateLimit-Policy"] = ", ".join(_policy_item(s.bucket) for s in visible)
    if tightest is not None:
        headers["RateLimit"] = (
            f'"{tightest.bucket.spec.name}";r={max(0, math.floor(tightest.remaining))}'
            f";t={math.ceil(tightest.reset_seconds)}"
        )
    for suffix, dimensions in (("requests", REQUEST_DIMENSIONS), ("tokens", TOKEN_DIMENSIONS)):
        kind = _tightest([s for s in visible if s.bucket.spec.dimension in dimensions])
        if kind is not None:
            headers[f"x-ratelimit-limit-{suffix}"] = str(round(kind.bucket.spec.capacity))
            headers[f"x-ratelimit-remaining-{suffix}"] = str(max(0, math.floor(kind.remaining)))
            headers[f"x-ratelimit-reset-{suffix}"] = go_duration(kind.reset_seconds)
    return headers


def _tightest(states: list[BucketState]) -> BucketState | None:
    """The bucket closest to refusing: the smallest remaining share of its capacity."""
    candidates = [s for s in states if s.bucket.spec.rule is not Rule.RAMP]
    if not candidates:
        return None
    return min(candidates, key=lambda s: s.remaining / s.bucket.spec.capacity)


_POLICY_ITEMS: dict[int, tuple[ScopedBucket, str]] = {}
POLICY_ITEMS_KEPT = 10_000  # a config has a few hundred buckets; new versions bring new ones


def _policy_item(bucket: ScopedBucket) -> str:
    """A bucket's ``RateLimit-Policy`` item, formatted once per bucket of a config version.
    Kept by the bucket's identity (the config snapshot's objects are the same on every
    request; hashing a frozen dataclass of ten fields costs about what formatting does), and
    the entry holds the bucket, so its id is not reused while it is kept."""
    kept = _POLICY_ITEMS.get(id(bucket))
    if kept is not None and kept[0] is bucket:
        return kept[1]
    if len(_POLICY_ITEMS) >= POLICY_ITEMS_KEPT:
        _POLICY_ITEMS.clear()
    item = _policy_item_format(bucket)
    _POLICY_ITEMS[id(bucket)] = (bucket, item)
    return item


def _policy_item_format(bucket: ScopedBucket) -> str:
    spec = bucket.spec
    item = f'"{spec.name}";q={math.floor(spec.capacity)}'
    window = _window_seconds(bucket)
    if window:
        item += f";w={window}"
    if spec.dimension is Dimension.REQUESTS:
        item += ';qu="requests"'
    elif spec.dimension is Dimension.CONCURRENCY:
        item += ';qu="concurrent-requests"'
    else:  # the draft registers no unit for tokens or money: a vendor parameter says it
        item += f';sy-unit="{spec.dimension.value}"'
    return item


def _window_seconds(bucket: ScopedBucket) -> int:
    spec = bucket.spec
    if spec.rule in (Rule.REFILL, Rule.ROLLING_WINDOW):
        return round(spec.period)
    if spec.rule is Rule.FIXED_WINDOW and spec.window is not None:
        return {"hour": 3600, "day": 86400, "week": 604800, "month": 2592000}[spec.window.value]
    return 0


def go_duration(seconds: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``1h2m3s``, ``120ms``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    total = math.ceil(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"
