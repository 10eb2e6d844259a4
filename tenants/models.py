"""The tenant hierarchy (SPEC A1): platform → partner → tenant → team → app → API key."""

from __future__ import annotations

from django.apps import apps
from django.conf import settings
from django.db import models
from django.utils import timezone

from common.reader import Invalid, list_of, model_slug, positive_number, slug
from common.rules import ConfigRules


class Partner(models.Model):
    """A reseller: its tenants share the partner's limits."""

    name = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Tenant(ConfigRules, models.Model):
    class Sort(models.TextChoices):
        ROUTING_COST = "", "routing cost (default)"
        PRICE = "price", "price"
        THROUGHPUT = "throughput", "throughput"
        LATENCY = "latency", "latency"

    name = models.SlugField(max_length=100, unique=True)
    partner = models.ForeignKey(
        Partner, null=True, blank=True, on_delete=models.PROTECT, related_name="tenants"
    )
    # Share of a contended pool relative to other tenants (D2); multiplied by the workload weight.
    weight = models.FloatField(default=1.0)
    # G13: a tenant may prefer a provider sort over the routing-cost default.
    default_sort = models.CharField(max_length=20, choices=Sort.choices, blank=True, default="")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    # A weight of 0 or less fails every request of the tenant in a contended pool.
    config_rules = {"weight": positive_number}

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Team(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="teams")
    name = models.SlugField(max_length=100)

    class Meta:
        ordering = ["tenant__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="team_unique_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.tenant.name}/{self.name}"


class App(models.Model):
    class Environment(models.TextChoices):
        PRODUCTION = "production"
        STAGING = "staging"
        DEVELOPMENT = "development"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="apps")
    name = models.SlugField(max_length=100)
    environment = models.CharField(
        max_length=20, choices=Environment.choices, default=Environment.PRODUCTION
    )
    default_workload = models.ForeignKey(
        "quotas.WorkloadClass",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Workload class of this app's requests unless the request names another.",
    )

    class Meta:
        ordering = ["team__tenant__name", "team__name", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="app_unique_per_team")]

    def __str__(self) -> str:
        return f"{self.team}/{self.name} ({self.environment})"


def allowed_models_check(value: object) -> list[str]:
    """A key's ``allowed_models``: a list of model slugs of the catalogue, as the file has it."""
    slugs = list_of(model_slug)(value)
    known = set(
        apps.get_model("routing", "Model")
        .objects.filter(slug__in=slugs)
        .values_list("slug", flat=True)
    )
    for i, name in enumerate(slugs):
        if name not in known:
            raise Invalid(f"unknown model '{name}'", at=f"[{i}]")
    return slugs


class ApiKey(ConfigRules, models.Model):
    """A2: the secret is shown once; only its SHA-256 and a short public prefix are stored."""

    # PROTECT: keys are revoked, never deleted, so neither is the app (team, tenant) of one.
    app = models.ForeignKey(App, on_delete=models.PROTECT, related_name="keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True, editable=False)
    secret_hash = models.CharField(max_length=64, unique=True, editable=False)
    allowed_models = models.JSONField(
        default=list,
        blank=True,
        help_text="Model slugs this key may use; empty means every model.",
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # The secret a rotation replaced keeps working until ``previous_valid_until`` (the overlap
    # lets callers switch to the new one without an outage); one previous secret at a time.
    previous_secret_hash = models.CharField(max_length=64, blank=True, default="", editable=False)
    previous_prefix = models.CharField(max_length=16, blank=True, default="", editable=False)
    previous_valid_until = models.DateTimeField(null=True, blank=True, editable=False)

    # The name is part of the key's bucket names (``api_key:acme/search/web/ci:…``).
    config_rules = {"name": slug, "allowed_models": allowed_models_check}

    class Meta:
        ordering = ["app__team__tenant__name", "app__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["app", "name"], name="key_name_unique_per_app")
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    @property
    def tenant(self) -> Tenant:
        return self.app.team.tenant

    def is_usable(self, now: timezone.datetime) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > now


class TenantMembership(models.Model):
    """A4: an admin user who belongs to one tenant and sees only that tenant's objects.

    One tenant per user keeps every scoping decision a comparison with one id; a person who
    works for two tenants has two accounts. Superusers are platform staff and need none.
    """

    class Role(models.TextChoices):
        ADMIN = "admin", "tenant admin (edits teams, apps, keys and their limits)"
        VIEWER = "viewer", "viewer (read-only)"

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tenant_membership"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.ADMIN)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant__name", "user__username"]
        verbose_name = "tenant membership"

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant.name} ({self.role})"

    @property
    def can_edit(self) -> bool:
        return self.role == self.Role.ADMIN
