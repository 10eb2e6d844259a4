"""Public bucket names: ``<scope kind>:<scope path>:<what is limited>``.

A bucket's name appears in response headers and refusals sent to the tenant (H1), so it names
the bucket's own scope only: ``tenant:acme:total_tokens:day``, ``provider:alpha:requests:1m``,
``app:acme/search/web:concurrency``, ``api_key:acme/search/web/ci:spend:rolling-5h``; on the
provider side ``credential:alpha/key-1:requests:1m``, ``project:alpha/research:input_tokens:1m``
and ``endpoint:acme/chat-large@alpha:output_tokens:1m``.
Names are derived from the limit's shape, so they stay the same from one load to the next.
"""

from __future__ import annotations

from common.durations import duration_format
from quotas.limits import LimitSpec


def scope_name(kind: str, *names: str) -> str:
    """``scope_name("app", "acme", "search", "web")`` → ``app:acme/search/web``."""
    return f"{kind}:{'/'.join(names)}"


def endpoint_scope_label(model_slug: str, provider: str) -> str:
    """An endpoint's part of its buckets' names: ``acme/chat-large@alpha`` (the router's key)."""
    return f"{model_slug}@{provider}"


def bucket_qualifier(
    *,
    dimension: str,
    rule: str,
    period_seconds: float | None = None,
    window: str = "",
    duration_seconds: float | None = None,
) -> str:
    """What a bucket limits, e.g. ``requests:1m``, ``total_tokens:day``, ``spend:rolling-5h``."""
    if rule == "concurrency":
        return "concurrency"
    if rule == "fixed_window":
        return f"{dimension}:{window}"
    if rule == "rolling_window" and duration_seconds:
        return f"{dimension}:rolling-{duration_format(duration_seconds)}"
    if period_seconds:  # refill and ramp
        return f"{dimension}:{duration_format(period_seconds)}"
    return dimension


def bucket_name(scope: str, limit: LimitSpec) -> str:
    if limit.label:
        return f"{scope}:{limit.label}"
    qualifier = bucket_qualifier(
        dimension=limit.dimension,
        rule=limit.rule,
        period_seconds=limit.period_seconds,
        window=limit.window,
        duration_seconds=limit.duration_seconds,
    )
    # A shadow limit usually runs beside the enforced one it may replace.
    return f"{scope}:{qualifier}:shadow" if limit.shadow else f"{scope}:{qualifier}"
