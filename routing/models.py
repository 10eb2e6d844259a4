"""The catalogue: providers, public models and the endpoints that serve them."""

from __future__ import annotations

from django.db import models

from routing import credentials


class Provider(models.Model):
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
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def set_api_key(self, secret: str) -> None:
        self.api_key_encrypted = credentials.encrypt(secret) if secret else ""

    def get_api_key(self) -> str:
        return credentials.decrypt(self.api_key_encrypted) if self.api_key_encrypted else ""


class Model(models.Model):
    """A public model id clients send (e.g. ``acme/chat-large``)."""

    slug = models.CharField(max_length=200, unique=True)
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
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Endpoint(models.Model):
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
        default=list, blank=True, help_text="Capabilities: tools, response_format, stream."
    )
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["model__slug", "position"]
        constraints = [
            models.UniqueConstraint(fields=["model", "provider"], name="endpoint_unique")
        ]

    def __str__(self) -> str:
        return f"{self.model.slug} @ {self.provider.name}"
