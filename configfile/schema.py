"""The configuration file's schema: one dataclass and one parser per section.

To add a field: add it to the dataclass and read it in the section's parser with
``s.field("key", converter, default)``; unknown keys are refused automatically, so a field the
parser does not read is reported as a typo. The word lists mirror the Django models' choices
(tests/config/test_config_schema.py checks that they agree). Limits live in ``quotas.limits``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from common.reader import (
    Invalid,
    Section,
    boolean,
    choice,
    duration,
    env_name,
    list_of,
    model_slug,
    non_negative_int,
    positive_int,
    positive_number,
    price,
    slug,
    text,
    timestamp,
    url,
)
from quotas.core.increments import DEFAULT_STEP_TOKENS
from quotas.limits import LimitSpec, parse_limit
from routing.validation import (
    CAPABILITIES,
    batch_discount,
    fallback_contract,
    region,
    routing_overrides,
)
from tenants.keys import KEY_TYPE_PREFIX

PROTOCOLS = ("openai", "anthropic")
OVERLOAD_ACTIONS = ("reject", "degrade", "defer")
# C10: a stream reserves its whole maximum output, or reserves it in steps as tokens arrive.
STREAM_RESERVATIONS = ("max", "increments")
ENVIRONMENTS = ("production", "staging", "development")
# A tenant's default provider sort (G13); "routing_cost" is the default and stored as "".
SORTS = ("routing_cost", "price", "throughput", "latency")
MIN_SECRET_LENGTH = 20


@dataclass(frozen=True)
class ProjectSpec:
    """B2: a project / workspace of the provider organisation, with limits of its own."""

    path: str
    name: str
    limits: list[LimitSpec]


@dataclass(frozen=True)
class CredentialSpec:
    """B2: one API key of the organisation's key pool, with limits of its own."""

    path: str
    name: str
    api_key_env: str
    project: str
    is_active: bool
    limits: list[LimitSpec]


@dataclass(frozen=True)
class ProviderSpec:
    """A provider organisation (account): its ``limits`` are the organisation's."""

    path: str
    name: str
    protocol: str
    base_url: str
    api_key_env: str
    cache_ttl_seconds: float
    learn_concurrency: bool
    is_active: bool
    limits: list[LimitSpec]
    projects: list[ProjectSpec] = field(default_factory=list)
    keys: list[CredentialSpec] = field(default_factory=list)


@dataclass(frozen=True)
class PriceSpec:
    """USD per million tokens."""

    input: Decimal
    cached_input: Decimal
    output: Decimal


@dataclass(frozen=True)
class EndpointSpec:
    path: str
    provider: str
    upstream_model: str
    price: PriceSpec
    context_window: int
    max_output: int
    supports: list[str]
    region: str
    quality_flagged: bool
    is_active: bool
    # The provider's limits on this one model for the organisation (endpoint scope, D1).
    limits: list[LimitSpec] = field(default_factory=list)
    batch: BatchApiSpec | None = None  # E5: the provider's batch API for this model


@dataclass(frozen=True)
class BatchApiSpec:
    discount: Decimal
    turnaround: float  # seconds


@dataclass(frozen=True)
class ModelSpec:
    path: str
    slug: str
    aliases: list[str]
    default_output_tokens: int
    default_input_tokens: int | None
    max_cost_premium: Decimal | None
    routing: dict[str, float]
    allow_fallbacks: bool
    fallback_model: str
    fallback_contract: dict[str, Any]
    is_active: bool
    endpoints: list[EndpointSpec]
    limits: list[LimitSpec]


@dataclass(frozen=True)
class WorkloadClassSpec:
    path: str
    name: str
    deadline_seconds: float
    max_queue_depth: int
    overload_action: str
    weight: float
    retry_budget: int
    stream_reservation: str = "max"
    stream_step_tokens: int = DEFAULT_STEP_TOKENS
    fallback_contract: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PartnerSpec:
    path: str
    name: str
    limits: list[LimitSpec]


@dataclass(frozen=True)
class KeySpec:
    path: str
    name: str
    # A literal secret (bootstrap and tests); empty means "generate one when the key is new".
    secret: str
    expires_at: dt.datetime | None
    allowed_models: list[str]
    limits: list[LimitSpec]


@dataclass(frozen=True)
class AppSpec:
    path: str
    name: str
    environment: str
    default_workload: str
    limits: list[LimitSpec]
    keys: list[KeySpec]


@dataclass(frozen=True)
class TeamSpec:
    path: str
    name: str
    limits: list[LimitSpec]
    apps: list[AppSpec]


@dataclass(frozen=True)
class TenantSpec:
    path: str
    name: str
    partner: str
    weight: float
    default_sort: str
    is_active: bool
    limits: list[LimitSpec]
    teams: list[TeamSpec]


@dataclass(frozen=True)
class Config:
    providers: list[ProviderSpec] = field(default_factory=list)
    models: list[ModelSpec] = field(default_factory=list)
    workload_classes: list[WorkloadClassSpec] = field(default_factory=list)
    partners: list[PartnerSpec] = field(default_factory=list)
    tenants: list[TenantSpec] = field(default_factory=list)


# --- Parsers ------------------------------------------------------------------------------------


def secret(value: object) -> str:
    literal = text(200)(value)
    if not literal.startswith(KEY_TYPE_PREFIX) or len(literal) < MIN_SECRET_LENGTH:
        raise Invalid(
            f"must start with '{KEY_TYPE_PREFIX}' and be at least {MIN_SECRET_LENGTH} characters"
        )
    return literal


def parse_config(s: Section) -> Config:
    config = Config(
        providers=s.sections("providers", parse_provider),
        models=s.sections("models", parse_model),
        workload_classes=s.sections("workload_classes", parse_workload_class),
        partners=s.sections("partners", parse_partner),
        tenants=s.sections("tenants", parse_tenant),
    )
    s.done()
    return config


def parse_provider(s: Section) -> ProviderSpec:
    spec = ProviderSpec(
        path=s.path,
        name=s.field("name", slug),
        protocol=s.field("protocol", choice(*PROTOCOLS)),
        base_url=s.field("base_url", url),
        api_key_env=s.field("api_key_env", env_name, ""),
        cache_ttl_seconds=s.field("cache_ttl", duration, 300.0),
        learn_concurrency=s.field("learn_concurrency", boolean, True),
        is_active=s.field("active", boolean, True),
        limits=s.sections("limits", parse_limit),
        projects=s.sections("projects", parse_project),
        keys=s.sections("keys", parse_credential),
    )
    if spec.keys and spec.api_key_env:
        s.errors.add(
            f"{s.path}.api_key_env",
            "give either api_key_env (one key) or keys (a key pool), not both",
        )
    s.done()
    return spec


def parse_project(s: Section) -> ProjectSpec:
    spec = ProjectSpec(
        path=s.path, name=s.field("name", slug), limits=s.sections("limits", parse_limit)
    )
    s.done()
    return spec


def parse_credential(s: Section) -> CredentialSpec:
    spec = CredentialSpec(
        path=s.path,
        name=s.field("name", slug),
        api_key_env=s.field("api_key_env", env_name),
        project=s.field("project", slug, ""),
        is_active=s.field("active", boolean, True),
        limits=s.sections("limits", parse_limit),
    )
    s.done()
    return spec


def parse_model(s: Section) -> ModelSpec:
    spec = ModelSpec(
        path=s.path,
        slug=s.field("slug", model_slug),
        aliases=s.field("aliases", list_of(model_slug), []),
        default_output_tokens=s.field("default_output_tokens", positive_int, 400),
        default_input_tokens=s.field("default_input_tokens", positive_int, None),
        # The cost guard's bound (issue 17): a fraction like a price, kept exact; none stated,
        # the default guards (routing/core/catalogue.py DEFAULT_MAX_COST_PREMIUM).
        max_cost_premium=s.field("max_cost_premium", price, None),
        routing=s.field("routing", routing_overrides, {}),
        allow_fallbacks=s.field("allow_fallbacks", boolean, True),
        fallback_model=s.field("fallback_model", model_slug, ""),
        fallback_contract=s.field("fallback_contract", fallback_contract, {}),
        is_active=s.field("active", boolean, True),
        endpoints=s.sections("endpoints", parse_endpoint),
        limits=s.sections("limits", parse_limit),
    )
    if not spec.endpoints and not s.has("endpoints"):
        s.errors.add(f"{s.path}.endpoints", "is required (at least one provider serving it)")
    s.done()
    return spec


def parse_endpoint(s: Section) -> EndpointSpec:
    spec = EndpointSpec(
        path=s.path,
        provider=s.field("provider", slug),
        upstream_model=s.field("upstream_model", text(200)),
        price=s.section("price", parse_price),
        context_window=s.field("context_window", positive_int),
        max_output=s.field("max_output", positive_int),
        supports=s.field("supports", list_of(choice(*CAPABILITIES)), []),
        region=s.field("region", region, ""),
        quality_flagged=s.field("quality_flagged", boolean, False),
        is_active=s.field("active", boolean, True),
        limits=s.sections("limits", parse_limit),
        batch=s.section("batch", parse_batch_api) if s.has("batch") else None,
    )
    both = isinstance(spec.max_output, int) and isinstance(spec.context_window, int)
    if both and spec.max_output > spec.context_window:
        s.errors.add(
            f"{s.path}.max_output",
            f"must not exceed context_window ({spec.context_window}), got {spec.max_output}",
        )
    s.done()
    return spec


def parse_batch_api(s: Section) -> BatchApiSpec:
    """``batch: {discount: 0.5, turnaround: 24h}``: the provider offers a batch API (E5)."""
    discount = s.field("discount", batch_discount, 0.5)  # None when invalid (reported)
    spec = BatchApiSpec(
        discount=Decimal(str(discount if discount is not None else 0.5)),
        turnaround=s.field("turnaround", duration, 86_400.0),
    )
    s.done()
    return spec


def parse_price(s: Section) -> PriceSpec:
    spec_input = s.field("input", price)
    spec = PriceSpec(
        input=spec_input,
        # Without a cache discount, cached input costs what input costs.
        cached_input=s.field("cached_input", price, spec_input),
        output=s.field("output", price),
    )
    s.done()
    return spec


def parse_workload_class(s: Section) -> WorkloadClassSpec:
    spec = WorkloadClassSpec(
        path=s.path,
        name=s.field("name", slug),
        deadline_seconds=s.field("deadline", duration),
        max_queue_depth=s.field("max_queue_depth", non_negative_int),
        overload_action=s.field("overload", choice(*OVERLOAD_ACTIONS)),
        weight=s.field("weight", positive_number, 1.0),
        retry_budget=s.field("retry_budget", non_negative_int, 2),
        stream_reservation=s.field("stream_reservation", choice(*STREAM_RESERVATIONS), "max"),
        stream_step_tokens=s.field("stream_step_tokens", positive_int, DEFAULT_STEP_TOKENS),
        fallback_contract=s.field("fallback_contract", fallback_contract, {}),
    )
    s.done()
    return spec


def parse_partner(s: Section) -> PartnerSpec:
    spec = PartnerSpec(
        path=s.path, name=s.field("name", slug), limits=s.sections("limits", parse_limit)
    )
    s.done()
    return spec


def parse_tenant(s: Section) -> TenantSpec:
    sort = s.field("default_sort", choice(*SORTS), "routing_cost")
    spec = TenantSpec(
        path=s.path,
        name=s.field("name", slug),
        partner=s.field("partner", slug, ""),
        weight=s.field("weight", positive_number, 1.0),
        default_sort="" if sort == "routing_cost" else sort,
        is_active=s.field("active", boolean, True),
        limits=s.sections("limits", parse_limit),
        teams=s.sections("teams", parse_team),
    )
    s.done()
    return spec


def parse_team(s: Section) -> TeamSpec:
    spec = TeamSpec(
        path=s.path,
        name=s.field("name", slug),
        limits=s.sections("limits", parse_limit),
        apps=s.sections("apps", parse_app),
    )
    s.done()
    return spec


def parse_app(s: Section) -> AppSpec:
    spec = AppSpec(
        path=s.path,
        name=s.field("name", slug),
        environment=s.field("environment", choice(*ENVIRONMENTS), "production"),
        default_workload=s.field("default_workload", slug, ""),
        limits=s.sections("limits", parse_limit),
        keys=s.sections("keys", parse_key),
    )
    s.done()
    return spec


def parse_key(s: Section) -> KeySpec:
    spec = KeySpec(
        path=s.path,
        name=s.field("name", slug),
        secret=s.field("secret", secret, ""),
        expires_at=s.field("expires_at", timestamp, None),
        allowed_models=s.field("allowed_models", list_of(model_slug), []),
        limits=s.sections("limits", parse_limit),
    )
    s.done()
    return spec
