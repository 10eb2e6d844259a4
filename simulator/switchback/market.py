"""The simulated market: providers (behaviour model), their buckets, endpoints and the router.

Built from the two files a deployment has: the gateway's configuration (models, endpoints,
prices, provider-side limits, workload classes — parsed by ``configfile``) and the
market file (how each provider behaves — ``simulator.model``). ``scale`` shrinks traffic and
every capacity together (provider limits, bucket capacities, spend caps): a smaller model of the
same market, for fast runs. Bucket specs come from ``quotas.core.specs.bucket_spec_build``, the
mapping the gateway applies to its database rows, so the broker sees exactly the same buckets.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, replace
from datetime import datetime
from zoneinfo import ZoneInfo

from configfile import Config
from quotas.core.learned import learned_concurrency, learned_name, needs_learned_concurrency
from quotas.core.model import BucketSpec, Rule
from quotas.core.specs import (
    RAMP_DEFAULT_FLOOR,
    bucket_spec_build,
    with_headroom,
    with_provider_rules,
)
from quotas.limits import LimitSpec
from quotas.names import bucket_name, scope_name
from routing.core import EndpointConfig, ModelConfig, RoutingParameters
from simulator.model import LimitsSpec, Market, ProviderBehaviour
from simulator.switchback.admission import Workload
from simulator.switchback.route import Route
from simulator.switchback.traffic import max_tokens_for

# Day 0 starts at local midnight of a Monday in a week without a DST change, so daily windows
# (reset at 00:00 America/Los_Angeles in the reference config) and the diurnal cycle line up.
LOCAL_ZONE = "America/Los_Angeles"
ORIGIN = datetime(2026, 1, 5, tzinfo=ZoneInfo(LOCAL_ZONE)).timestamp()
DEFAULT_WORKLOAD = Workload(deadline_s=10.0, retry_budget=2)  # gateway.call.DEFAULT_WORKLOAD


class SwitchbackError(ValueError):
    """The configuration and the market file do not fit together."""


@dataclass
class SimMarket:
    routes: dict[str, Route]  # endpoint id → route
    models: list[ModelConfig]
    behaviours: dict[str, ProviderBehaviour]
    workload: Workload
    route_names: list[str]  # the traffic's routes (model slugs), in file order
    endpoint_ids: list[str]
    max_input_tokens: dict[str, int]


def market_build(
    config: Config,
    market: Market,
    *,
    scale: float,
    rng: random.Random,
    origin: float = ORIGIN,
    params: RoutingParameters | None = None,
    workload: str = "interactive",
    headroom_s: float = 1.0,
    learn_concurrency: bool = True,
) -> SimMarket:
    """Providers, buckets, endpoints and routes of the simulated market (traffic ``× scale``).

    Provider refill buckets keep ``headroom_s`` of refill back, and providers with no
    configured concurrency limit learn one (``learn_concurrency``), as the gateway's snapshot
    does (``quotas.core.specs.with_headroom``, ``PROVIDER_HEADROOM_SECONDS``;
    ``quotas.core.learned``, ``LEARN_PROVIDER_CONCURRENCY``).
    """
    if market.traffic is None:
        raise SwitchbackError("the market file has no traffic section")
    specs = {p.name: p for p in market.providers}
    configured = {p.name: p for p in config.providers}
    behaviours: dict[str, ProviderBehaviour] = {}
    buckets: dict[str, tuple[BucketSpec, ...]] = {}
    for name, provider in configured.items():
        if name not in specs:
            continue
        spec = replace(specs[name], limits=_scaled_limits(specs[name].limits, scale))
        behaviours[name] = ProviderBehaviour(
            spec,
            random.Random(rng.getrandbits(64)),
            origin,
            prompt_cache_ttl_s=provider.cache_ttl_seconds,
        )
        scope = scope_name("provider", name)
        buckets[name] = tuple(
            with_headroom(
                with_provider_rules(_bucket(scope, name, limit, scale), provider.protocol),
                headroom_s,
            )
            for limit in provider.limits
        )
        learns = learn_concurrency and provider.learn_concurrency
        if learns and needs_learned_concurrency(buckets[name]):
            learned = learned_concurrency(scope, learned_name(scope))
            buckets[name] = (*buckets[name], learned)
    parameters = params or RoutingParameters()
    models: list[ModelConfig] = []
    routes: dict[str, Route] = {}
    by_slug = {m.slug: m for m in config.models}
    max_input: dict[str, int] = {}
    for slug, traffic in market.traffic.models.items():
        model = by_slug.get(slug)
        if model is None:
            raise SwitchbackError(f"traffic.models.{slug}: no such model in the configuration")
        endpoints = []
        for ep in model.endpoints:
            if not ep.is_active or ep.provider not in behaviours:
                continue
            if ep.upstream_model not in specs[ep.provider].models:
                raise SwitchbackError(
                    f"{ep.path}: provider {ep.provider} serves no {ep.upstream_model!r} "
                    "in the market"
                )
            endpoint = EndpointConfig(
                id=f"{slug}@{ep.provider}",
                provider=ep.provider,
                model=slug,
                price_input=float(ep.price.input),
                price_cached_input=float(ep.price.cached_input),
                price_output=float(ep.price.output),
                context_window=ep.context_window,
                max_output=ep.max_output,
                supports=frozenset(ep.supports),
                cache_ttl_s=configured[ep.provider].cache_ttl_seconds,
            )
            endpoints.append(endpoint)
            routes[endpoint.id] = Route(
                endpoint=endpoint,
                behaviour=behaviours[ep.provider],
                upstream=ep.upstream_model,
                buckets=buckets[ep.provider],
                scope=f"provider:{ep.provider}",
            )
        if not endpoints:
            raise SwitchbackError(f"models.{slug}: no endpoint at a provider of the market")
        models.append(
            ModelConfig(
                slug=slug,
                endpoints=tuple(endpoints),
                params=_model_parameters(parameters, model.routing),
                default_output_tokens=float(model.default_output_tokens),
                max_cost_premium=(
                    None if model.max_cost_premium is None else float(model.max_cost_premium)
                ),
            )
        )
        widest = max(e.context_window for e in endpoints)
        max_input[slug] = widest - max_tokens_for(traffic)
    return SimMarket(
        routes=routes,
        models=models,
        behaviours=behaviours,
        workload=_workload(config, workload),
        route_names=list(market.traffic.models),
        endpoint_ids=list(routes),
        max_input_tokens=max_input,
    )


def _scaled_limits(limits: LimitsSpec, scale: float) -> LimitsSpec:
    if scale == 1.0:
        return limits
    values = {
        f.name: None
        if getattr(limits, f.name) is None
        else _at_least_one(getattr(limits, f.name), scale)
        for f in dataclasses.fields(limits)
    }
    return LimitsSpec(**values)


def _at_least_one(value: int, scale: float) -> int:
    return max(1, round(value * scale))


def _bucket(scope: str, provider: str, limit: LimitSpec, scale: float) -> BucketSpec:
    capacity = limit.capacity
    if capacity is None and limit.rule == Rule.RAMP.value and scale != 1.0:
        capacity = RAMP_DEFAULT_FLOOR
    if capacity is not None and scale != 1.0:
        capacity = capacity * scale
        if limit.rule in (Rule.CONCURRENCY.value, Rule.RAMP.value) or limit.dimension == "requests":
            capacity = float(max(1, round(capacity)))
    return bucket_spec_build(
        name=bucket_name(scope, limit),
        scope=f"provider:{provider}",
        dimension=limit.dimension,
        rule=limit.rule,
        capacity=capacity,
        period_seconds=limit.period_seconds,
        duration_seconds=limit.duration_seconds,
        window=limit.window,
        resets_at=limit.resets_at,
        timezone=limit.timezone,
        factor=limit.factor,
        shadow=limit.shadow,
    )


def _workload(config: Config, name: str) -> Workload:
    for spec in config.workload_classes:
        if spec.name == name:
            return Workload(
                deadline_s=spec.deadline_seconds,
                retry_budget=spec.retry_budget,
                weight=spec.weight,
                max_queue_depth=spec.max_queue_depth,
                stream_reservation=spec.stream_reservation,
                stream_step_tokens=spec.stream_step_tokens,
            )
    return DEFAULT_WORKLOAD


def _model_parameters(base: RoutingParameters, overrides: dict[str, float]) -> RoutingParameters:
    """A model's routing parameters: the run's, then its own ``routing``, as in the gateway."""
    return replace(base, **overrides) if overrides else base
