"""The catalogue as plain values for the hot path: models, their endpoints and providers."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from routing.core.catalogue import EndpointConfig, ModelConfig
from routing.core.contracts import contract_parse
from routing.core.overrides import model_suffix_split
from routing.models import Credential, Endpoint, Model, Provider, routing_parameters


@dataclass(frozen=True, slots=True)
class CredentialEntry:
    """One API key of a provider's key pool (B2). ``id`` None: the account's own single key
    (a provider that declares no ``keys``), which has no buckets of its own."""

    id: int | None
    name: str
    api_key: str
    project_id: int | None = None


@dataclass(frozen=True, slots=True)
class ProviderEntry:
    id: int
    name: str
    protocol: str
    base_url: str
    api_key: str
    cache_ttl_seconds: float
    # The key pool, in name order; never empty (the account's own key when it declares none).
    credentials: tuple[CredentialEntry, ...] = ()

    @property
    def pool(self) -> tuple[CredentialEntry, ...]:
        return self.credentials or (CredentialEntry(None, "", self.api_key),)


@dataclass(frozen=True, slots=True)
class EndpointEntry:
    id: int
    key: str  # the router's id for it: "<model slug>@<provider name>"
    model_id: int
    model_slug: str
    provider: ProviderEntry
    upstream_model: str
    price_input: float  # USD per million tokens
    price_cached_input: float
    price_output: float
    context_window: int
    max_output: int
    supports: frozenset[str]
    region: str = ""  # F5: data-residency tag
    # E5: the provider's batch API for this model: the share off the price, the longest it takes.
    batch_api: bool = False
    batch_discount: float = 0.0
    batch_turnaround: float = 86_400.0

    def cost(self, *, input_tokens: int, cached_input_tokens: int, output_tokens: int) -> float:
        """What the provider charges for this usage, in USD."""
        uncached = input_tokens - cached_input_tokens
        return (
            uncached * self.price_input
            + cached_input_tokens * self.price_cached_input
            + output_tokens * self.price_output
        ) / 1_000_000


@dataclass(frozen=True, slots=True)
class ModelEntry:
    id: int
    slug: str
    aliases: tuple[str, ...]  # other ids clients send for it (issue 16 item 5)
    created: int  # epoch seconds the model row was made (/v1/models ``created``)
    default_output_tokens: int
    allow_fallbacks: bool
    fallback_slug: str | None
    endpoints: tuple[EndpointEntry, ...]  # in configured order
    routing: ModelConfig  # the router's view of the model


@dataclass(frozen=True)
class Catalogue:
    models: dict[str, ModelEntry]
    providers: dict[str, ProviderEntry]
    endpoints: dict[str, EndpointEntry]  # by router key
    aliases: dict[str, str] = field(default_factory=dict)  # alias → the model's slug

    def routing_name(self, requested: str) -> str:
        """``requested`` as the router knows it: an alias replaced by its model's slug, a
        ``:floor`` / ``:nitro`` suffix kept."""
        name, _ = model_suffix_split(requested)
        slug = self.aliases.get(name) if name not in self.models else None
        return requested if slug is None else slug + requested[len(name) :]

    def model_named(self, name: str) -> ModelEntry | None:
        """The model a client means by ``name``: its slug, or one of its aliases."""
        model = self.models.get(name)
        if model is None:
            slug = self.aliases.get(name)
            model = self.models.get(slug) if slug is not None else None
        return model


def catalogue_build() -> Catalogue:
    pools: dict[int, list[CredentialEntry]] = {}
    for c in Credential.objects.filter(is_active=True).order_by("name"):
        pools.setdefault(c.provider_id, []).append(
            CredentialEntry(id=c.pk, name=c.name, api_key=c.get_api_key(), project_id=c.project_id)
        )
    providers = {
        p.pk: ProviderEntry(
            id=p.pk,
            name=p.name,
            protocol=p.protocol,
            base_url=p.base_url.rstrip("/"),
            api_key=p.get_api_key(),
            cache_ttl_seconds=p.cache_ttl_seconds,
            credentials=tuple(pools.get(p.pk, ())),
        )
        for p in Provider.objects.filter(is_active=True)
    }
    endpoints: dict[int, list[EndpointEntry]] = {}
    flagged: set[int] = set()
    for e in Endpoint.objects.filter(is_active=True).select_related("model").order_by("position"):
        provider = providers.get(e.provider_id)
        if provider is None:
            continue
        if e.quality_flagged:
            flagged.add(e.pk)
        endpoints.setdefault(e.model_id, []).append(
            EndpointEntry(
                id=e.pk,
                key=f"{e.model.slug}@{provider.name}",
                model_id=e.model_id,
                model_slug=e.model.slug,
                provider=provider,
                upstream_model=e.upstream_model,
                price_input=float(e.price_input),
                price_cached_input=float(e.price_cached_input),
                price_output=float(e.price_output),
                context_window=e.context_window,
                max_output=e.max_output,
                supports=frozenset(e.supports or ()),
                region=e.region,
                batch_api=e.batch_api,
                batch_discount=float(e.batch_discount),
                batch_turnaround=float(e.batch_turnaround_seconds),
            )
        )
    models = {}
    for m in Model.objects.filter(is_active=True).select_related("fallback_model"):
        served = tuple(endpoints.get(m.pk, ()))
        models[m.slug] = ModelEntry(
            id=m.pk,
            slug=m.slug,
            aliases=tuple(m.aliases or ()),
            created=int(m.created_at.timestamp()),
            default_output_tokens=m.default_output_tokens,
            allow_fallbacks=m.allow_fallbacks,
            fallback_slug=m.fallback_model.slug if m.fallback_model else None,
            endpoints=served,
            routing=ModelConfig(
                slug=m.slug,
                endpoints=tuple(_endpoint_config(e, e.id in flagged) for e in served),
                params=routing_parameters(m.routing_parameters),
                default_output_tokens=float(m.default_output_tokens),
                default_input_tokens=m.default_input_tokens,
                max_cost_premium=_fraction(m.max_cost_premium),
                contract=contract_parse(m.fallback_contract or None),
            ),
        )
    return Catalogue(
        models=models,
        providers={p.name: p for p in providers.values()},
        endpoints={e.key: e for served in endpoints.values() for e in served},
        # A model's own id wins over another's alias, should an admin have made them collide.
        aliases={
            alias: model.slug
            for model in models.values()
            for alias in model.aliases
            if alias not in models
        },
    )


def _endpoint_config(entry: EndpointEntry, flagged: bool) -> EndpointConfig:
    return EndpointConfig(
        id=entry.key,
        provider=entry.provider.name,
        model=entry.model_slug,
        price_input=entry.price_input,
        price_cached_input=entry.price_cached_input,
        price_output=entry.price_output,
        context_window=entry.context_window,
        max_output=entry.max_output,
        supports=entry.supports,
        cache_ttl_s=entry.provider.cache_ttl_seconds,
        flagged=flagged,
        region=entry.region,
    )


def _fraction(value: Decimal | None) -> float | None:
    return None if value is None else float(value)
