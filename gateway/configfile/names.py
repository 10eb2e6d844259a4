"""Public bucket names: ``<scope kind>:<scope path>:<what is limited>``.

A bucket's name appears in response headers and refusals sent to the tenant (H1), so it names
the bucket's own scope only: ``tenant:acme:total_tokens:day``, ``provider:alpha:requests:1m``,
``app:acme/search/web:concurrency``, ``api_key:acme/search/web/ci:spend:rolling-5h``.
Names are derived from the limit's shape, so they stay the same from one load to the next.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from common.durations import duration_format
from gateway.configfile.limits import LimitSpec
from gateway.configfile.schema import Config


def scope_name(kind: str, *names: str) -> str:
    """``scope_name("app", "acme", "search", "web")`` → ``app:acme/search/web``."""
    return f"{kind}:{'/'.join(names)}"


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


def scoped_limits(config: Config) -> Iterator[tuple[str, LimitSpec]]:
    """Every limit of the file with its scope name, in file order.

    A scope whose name (or an enclosing one) was refused is skipped: the schema recorded that
    error and left the name as None, and the limits' names cannot be formed without it.
    """
    for provider in config.providers:
        yield from _limits(provider.limits, "provider", provider.name)
    for model in config.models:
        yield from _limits(model.limits, "model", model.slug)
    for partner in config.partners:
        yield from _limits(partner.limits, "partner", partner.name)
    for tenant in config.tenants:
        yield from _limits(tenant.limits, "tenant", tenant.name)
        for team in tenant.teams:
            path = (tenant.name, team.name)
            yield from _limits(team.limits, "team", *path)
            for app in team.apps:
                yield from _limits(app.limits, "app", *path, app.name)
                for key in app.keys:
                    yield from _limits(key.limits, "api_key", *path, app.name, key.name)


def _limits(
    limits: Iterable[LimitSpec], kind: str, *names: str | None
) -> Iterator[tuple[str, LimitSpec]]:
    if any(name is None for name in names):
        return
    scope = scope_name(kind, *(name for name in names if name is not None))
    yield from ((scope, limit) for limit in limits)
