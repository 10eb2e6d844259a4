"""The catalogue: providers, public models and the endpoints that serve them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from common.reader import (
    choice,
    list_of,
    model_slug,
    non_negative_number,
    positive_int,
    url,
)
from common.rules import ConfigRules, exact, seconds
from routing import credentials, validation
from routing.core.parameters import RoutingParameters
from routing.validation import CAPABILITIES, routing_overrides


def routing_parameters(overrides: dict[str, Any]) -> RoutingParameters:
    """A model's routing parameters: the deployment's defaults, then the model's overrides."""
    if not isinstance(overrides, dict):
        raise ValueError("must be an object of parameter names and values")
    return RoutingParameters(**{**settings.ROUTING_PARAMETERS, **overrides})


class Provider(ConfigRules, models.Model):
    class Protocol(models.TextChoices):
        OPENAI = "openai", "OpenAI Chat Completions"
        ANTHROPIC = "anthropic", "Anthropic Messages"

    name = models.SlugField(max_length=100, unique=True)
    protocol = models.CharField(max_length=20, choices=Protocol.choices)
    base_url = models.URLField(max_length=500)
    # Fernet token of the provider credential (routing/credentials.py); never shown back.
    api_key_encrypted = models.TextField(blank=True, default="", editable=False)
    # G12: a conversation stays on this provider while its prompt cache is warm.
    cache_ttl_seconds = models.FloatField(default=300.0)
    # B1: without a configured concurrency limit, one is learned from the 429s that no limit in
    # their headers explains (quotas/core/learned.py). Off for a provider whose 429s carry no
    # rate-limit headers at all, if its token limits should not be read as concurrency.
    learn_concurrency = models.BooleanField(
        default=True,
        help_text="Learn a concurrency limit from 429s that no configured limit explains "
        "(only while no concurrency limit is configured).",
    )
    is_active = models.BooleanField(default=True)

    config_rules = {"base_url": url, "cache_ttl_seconds": seconds}

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def set_api_key(self, secret: str) -> None:
        self.api_key_encrypted = credentials.encrypt(secret) if secret else ""

    def get_api_key(self) -> str:
        return credentials.decrypt(self.api_key_encrypted) if self.api_key_encrypted else ""


class ProviderProject(models.Model):
    """B2, D1: a project / workspace of a provider organisation (the ``Provider`` account),
    which providers give limits of its own; its API keys draw from them and the organisation's."""

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="projects")
    name = models.SlugField(max_length=100)

    class Meta:
        ordering = ["provider__name", "name"]
        verbose_name = "provider project"
        constraints = [
            models.UniqueConstraint(fields=["provider", "name"], name="provider_project_unique")
        ]

    def __str__(self) -> str:
        return f"{self.provider.name}/{self.name}"


class Credential(models.Model):
    """One API key of a provider organisation (a key pool's member, SPEC B2): its own buckets,
    its own health. A provider with none uses its account's own ``api_key_encrypted``."""

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="credentials")
    project = models.ForeignKey(
        ProviderProject,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="credentials",
        help_text="The project / workspace the key belongs to (its limits apply too).",
    )
    name = models.SlugField(max_length=100)
    # Fernet token (routing/credentials.py); never shown back.
    api_key_encrypted = models.TextField(blank=True, default="", editable=False)
    is_active = models.BooleanField(
        default=True, help_text="Off: the key is not used (revoked, or kept for later)."
    )

    class Meta:
        ordering = ["provider__name", "name"]
        verbose_name = "provider credential"
        constraints = [
            models.UniqueConstraint(fields=["provider", "name"], name="credential_unique")
        ]

    def __str__(self) -> str:
        return f"{self.provider.name}/{self.name}"

    def clean(self) -> None:
        if (
            self.project_id is not None
            and self.provider_id is not None
            and self.project is not None
            and self.project.provider_id != self.provider_id
        ):
            raise ValidationError(
                {"project": f"must be a project of the provider '{self.provider.name}'"}
            )

    def set_api_key(self, secret: str) -> None:
        self.api_key_encrypted = credentials.encrypt(secret) if secret else ""

    def get_api_key(self) -> str:
        return credentials.decrypt(self.api_key_encrypted) if self.api_key_encrypted else ""


class Model(ConfigRules, models.Model):
    """A public model id clients send (e.g. ``acme/chat-large``)."""

    slug = models.CharField(max_length=200, unique=True)
    # /v1/models shows it as ``created`` (the OpenAI and OpenRouter model objects' field).
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    default_output_tokens = models.PositiveIntegerField(
        default=400, help_text="Output estimate when a request gives no max_tokens (C2)."
    )
    allow_fallbacks = models.BooleanField(
        default=True,
        help_text="F5: whether a failed attempt may move to another endpoint of this model.",
    )
    fallback_model = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="E2: where overload action 'degrade' sends a request that does not fit.",
    )
    default_input_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Input estimate for routing before any traffic was seen (G2); empty: 1000.",
    )
    routing_parameters = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            "Overrides of the routing parameters (routing/core/parameters.py), e.g. "
            '{"band": 0.2, "time_value": 0.8}. Unknown names are refused.'
        ),
    )
    # Issue 16 item 5: other names clients send for it (a coding agent's built-in
    # ``claude-sonnet-4-5``); each is unique among every model's slug and aliases.
    aliases = models.JSONField(
        default=list,
        blank=True,
        help_text='Other model ids clients may send for this model, e.g. ["claude-sonnet-4-5"].',
    )
    # Issue 17: the cost guard's bound on the routing-cost shares' expected price premium.
    max_cost_premium = models.DecimalField(
        max_digits=6,
        decimal_places=4,
        null=True,
        blank=True,
        default=None,
        help_text=(
            "Cost guard: the traffic mix's expected price at most this fraction above the "
            "cheapest eligible endpoint's (0.06 = +6 %); a request's provider.max_cost_premium "
            "replaces it. Empty: the default, +6 % or what price-only routing would pay if "
            "that is more, and no slower than price-only routing."
        ),
    )
    # F5: what a fallback attempt may differ in from the first choice (routing/core/contracts.py).
    fallback_contract = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            "F5: what a fallback (any attempt after the first choice) may differ in, e.g. "
            '{"providers": ["alpha", "gamma"], "regions": "same", "max_price_ratio": 1.5, '
            '"max_latency_ratio": 2, "context": "same_or_larger", "features": "same"}. '
            "Empty: any difference."
        ),
    )
    is_active = models.BooleanField(default=True)

    config_rules = {
        "slug": model_slug,
        "fallback_contract": validation.fallback_contract,
        "max_cost_premium": exact(non_negative_number),
        "aliases": list_of(model_slug),
        "default_output_tokens": positive_int,
        "default_input_tokens": positive_int,
        "routing_parameters": routing_overrides,
    }

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        if self.fallback_contract is None:  # an emptied admin field: no contract, not NULL
            self.fallback_contract = {}
        errors: dict[str, str] = {}
        try:
            routing_parameters(self.routing_parameters)
        except (TypeError, ValueError) as exc:
            errors["routing_parameters"] = str(exc)
        if self.fallback_model_id is not None and self.fallback_model_id == self.pk:
            errors["fallback_model"] = "must name another model"
        errors.update(self._name_clashes())
        if errors:
            raise ValidationError(errors)

    def _name_clashes(self) -> dict[str, str]:
        """A name of this model (its id, an alias) that is taken or repeated, by field."""
        aliases = self.aliases if isinstance(self.aliases, list) else []
        if self.slug in aliases:
            return {"aliases": f"'{self.slug}' is the model's own id"}
        if len(set(aliases)) < len(aliases):
            return {"aliases": "names an alias twice"}
        # The slug's own uniqueness is the database's to report; its use as an alias is not.
        for slug, theirs in Model.objects.exclude(pk=self.pk).values_list("slug", "aliases"):
            theirs = theirs or []
            if self.slug in theirs:
                return {"slug": f"'{self.slug}' is an alias of the model '{slug}'"}
            for alias in aliases:
                if alias == slug or alias in theirs:
                    return {"aliases": f"'{alias}' is already a name of the model '{slug}'"}
        return {}


class Endpoint(ConfigRules, models.Model):
    """One provider serving one model: prices are USD per million tokens."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="endpoints")
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="endpoints")
    upstream_model = models.CharField(max_length=200)
    position = models.PositiveIntegerField(default=0, help_text="Order within the model.")
    price_input = models.DecimalField(max_digits=12, decimal_places=6)
    price_cached_input = models.DecimalField(max_digits=12, decimal_places=6)
    price_output = models.DecimalField(max_digits=12, decimal_places=6)
    context_window = models.PositiveIntegerField()
    max_output = models.PositiveIntegerField()
    supports = models.JSONField(
        default=list,
        blank=True,
        help_text="Capabilities: tools, response_format, stream, embeddings (serves only those).",
    )
    quality_flagged = models.BooleanField(
        default=False,
        help_text="G8: flagged for bad output; it gets only a small test share until cleared.",
    )
    quality_note = models.CharField(max_length=200, blank=True, default="")
    region = models.CharField(
        max_length=40,
        blank=True,
        default="",
        help_text="F5: data-residency tag (e.g. eu, us) a model's fallback contract may constrain.",
    )
    batch_api = models.BooleanField(
        default=False,
        help_text="E5: the provider offers a batch API for this model (OpenAI's batches, "
        "Anthropic's message batches); a Batch API batch may be sent there.",
    )
    batch_discount = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        default=Decimal("0.5"),
        help_text="E5: the share of the price the provider takes off batch lines (0.5: half).",
    )
    batch_turnaround_seconds = models.PositiveIntegerField(
        default=86_400,
        help_text="E5: the longest the provider's batch API takes (its window); a batch goes "
        "there only while at least this much of its own window is left.",
    )
    is_active = models.BooleanField(default=True)

    # A string in ``supports`` would be read letter by letter; sizes of 0 fit no request.
    config_rules = {
        "price_input": exact(non_negative_number),
        "price_cached_input": exact(non_negative_number),
        "price_output": exact(non_negative_number),
        "context_window": positive_int,
        "max_output": positive_int,
        "supports": list_of(choice(*CAPABILITIES)),
        "region": validation.region,
        "batch_discount": exact(validation.batch_discount),
        "batch_turnaround_seconds": positive_int,
    }

    class Meta:
        ordering = ["model__slug", "position"]
        constraints = [
            models.UniqueConstraint(fields=["model", "provider"], name="endpoint_unique")
        ]

    def __str__(self) -> str:
        return f"{self.model.slug} @ {self.provider.name}"

    def clean(self) -> None:
        window, most = self.context_window, self.max_output
        if isinstance(window, int) and isinstance(most, int) and 0 < window < most:
            raise ValidationError(
                {"max_output": f"must not exceed context_window ({window}), got {most}"}
            )
