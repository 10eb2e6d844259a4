"""Canonical quota configuration (SPEC B1–B3, E1): buckets and workload classes."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from common.reader import non_negative_int, positive_int, positive_number
from common.rules import ConfigRules, seconds
from quotas.core.increments import DEFAULT_STEP_TOKENS
from quotas.validation import bucket_defaults, bucket_errors
from routing import validation as routing_validation


class WorkloadClass(ConfigRules, models.Model):
    class Overload(models.TextChoices):
        REJECT = "reject", "reject at once"
        DEGRADE = "degrade", "degrade to the fallback model"
        DEFER = "defer", "defer (queue until the deadline)"

    class StreamReservation(models.TextChoices):
        MAX = "max", "the whole maximum output, the unused part given back at the end"
        INCREMENTS = "increments", "in steps, as the tokens arrive"

    name = models.SlugField(max_length=50, unique=True)
    deadline_seconds = models.FloatField(help_text="How long a request may wait for capacity.")
    max_queue_depth = models.PositiveIntegerField()
    overload_action = models.CharField(max_length=10, choices=Overload.choices)
    weight = models.FloatField(default=1.0, help_text="Share in a contended pool (D2).")
    retry_budget = models.PositiveIntegerField(
        default=2, help_text="Attempts after the first, fallbacks included (F4)."
    )
    # C10: how a stream of this class reserves its output (quotas.core.increments).
    stream_reservation = models.CharField(
        max_length=10,
        choices=StreamReservation.choices,
        default=StreamReservation.MAX,
        help_text="How a stream reserves its output (C10): all of it at once, or in steps.",
    )
    stream_step_tokens = models.PositiveIntegerField(
        default=DEFAULT_STEP_TOKENS,
        help_text="Output tokens reserved per step when streams reserve in increments.",
    )
    # F5: narrows the fallback contract of every route a request of this class takes.
    fallback_contract = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            "F5: what a fallback may differ in for requests of this class, narrowing the "
            "model's own contract clause by clause (never widening it), e.g. "
            '{"regions": "same", "max_latency_ratio": 1.5}. Empty: the model\'s contract alone.'
        ),
    )

    # A weight of 0 fails every request of the class, a deadline of 0 refuses them all (E1, D2).
    config_rules = {
        "deadline_seconds": seconds,
        "max_queue_depth": non_negative_int,
        "weight": positive_number,
        "retry_budget": non_negative_int,
        "stream_step_tokens": positive_int,
        "fallback_contract": routing_validation.fallback_contract,
    }

    class Meta:
        ordering = ["-weight", "name"]
        verbose_name = "workload class"
        verbose_name_plural = "workload classes"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.fallback_contract is None:  # an emptied admin field: no contract, not NULL
            self.fallback_contract = {}


class Bucket(models.Model):
    """One limit: a scope, a dimension, a capacity and a rule (B1)."""

    class ScopeKind(models.TextChoices):
        API_KEY = "api_key", "API key"
        APP = "app", "app"
        TEAM = "team", "team"
        TENANT = "tenant", "tenant"
        PARTNER = "partner", "partner"
        CREDENTIAL = "credential", "provider API key"
        PROJECT = "project", "provider project"
        ENDPOINT = "endpoint", "endpoint (provider × model)"
        PROVIDER = "provider", "provider account"
        MODEL = "model", "model route"

    class Dimension(models.TextChoices):
        REQUESTS = "requests"
        INPUT_TOKENS = "input_tokens"
        OUTPUT_TOKENS = "output_tokens"
        TOTAL_TOKENS = "total_tokens"
        SPEND = "spend", "spend (USD)"
        CONCURRENCY = "concurrency"
        RAMP = "ramp"

    class Rule(models.TextChoices):
        REFILL = "refill", "continuous refill over a period"
        FIXED_WINDOW = "fixed_window", "fixed window resetting at a wall-clock time"
        ROLLING_WINDOW = "rolling_window", "rolling window of a duration"
        CONCURRENCY = "concurrency", "held while a request is in flight"
        RAMP = "ramp", "growth factor per interval"

    class Source(models.TextChoices):
        CONFIGURED = "configured"
        LEARNED = "learned", "learned from provider headers"
        PROVIDER_DEFAULT = "provider_default", "provider default"

    class Window(models.TextChoices):
        HOUR = "hour"
        DAY = "day"
        WEEK = "week"
        MONTH = "month"

    # The public name appears in response headers (H1) and in refusals: it names the scope
    # kind and the scope's own name only, never another tenant's.
    name = models.CharField(max_length=200, unique=True)
    scope_kind = models.CharField(max_length=20, choices=ScopeKind.choices)
    api_key = models.ForeignKey(
        "tenants.ApiKey", null=True, blank=True, on_delete=models.CASCADE, related_name="buckets"
    )
    app = models.ForeignKey(
        "tenants.App", null=True, blank=True, on_delete=models.CASCADE, related_name="buckets"
    )
    team = models.ForeignKey(
        "tenants.Team", null=True, blank=True, on_delete=models.CASCADE, related_name="buckets"
    )
    tenant = models.ForeignKey(
        "tenants.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="buckets"
    )
    partner = models.ForeignKey(
        "tenants.Partner", null=True, blank=True, on_delete=models.CASCADE, related_name="buckets"
    )
    credential = models.ForeignKey(
        "routing.Credential",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="buckets",
    )
    project = models.ForeignKey(
        "routing.ProviderProject",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="buckets",
    )
    endpoint = models.ForeignKey(
        "routing.Endpoint", null=True, blank=True, on_delete=models.CASCADE, related_name="buckets"
    )
    provider = models.ForeignKey(
        "routing.Provider", null=True, blank=True, on_delete=models.CASCADE, related_name="buckets"
    )
    model = models.ForeignKey(
        "routing.Model", null=True, blank=True, on_delete=models.CASCADE, related_name="buckets"
    )
    dimension = models.CharField(max_length=20, choices=Dimension.choices)
    rule = models.CharField(max_length=20, choices=Rule.choices)
    capacity = models.FloatField(null=True, blank=True, help_text="Empty only for ramp limits.")
    period_seconds = models.FloatField(
        null=True, blank=True, help_text="Refill period, or the ramp interval."
    )
    window = models.CharField(max_length=10, choices=Window.choices, blank=True, default="")
    resets_at = models.TimeField(null=True, blank=True)
    timezone = models.CharField(max_length=64, blank=True, default="")
    duration_seconds = models.FloatField(null=True, blank=True, help_text="Rolling window length.")
    factor = models.FloatField(
        null=True, blank=True, help_text="Ramp: allowed growth per interval."
    )
    source = models.CharField(max_length=20, choices=Source.choices, default=Source.CONFIGURED)
    shadow = models.BooleanField(
        default=False,
        help_text="Evaluated and counted, but refuses nothing: try a new limit on live traffic.",
    )

    # Narrowest first: the order in which the broker checks a request's buckets (D1,
    # quotas/snapshot.py SCOPE_ORDER).
    SCOPE_FIELDS = (
        "api_key",
        "app",
        "team",
        "tenant",
        "partner",
        "credential",
        "project",
        "endpoint",
        "provider",
        "model",
    )
    LIMIT_FIELDS = (
        "dimension",
        "rule",
        "capacity",
        "period_seconds",
        "window",
        "resets_at",
        "timezone",
        "duration_seconds",
        "factor",
        "shadow",
    )

    class Meta:
        ordering = ["scope_kind", "name"]

    def __str__(self) -> str:
        return self.name

    def scope_object(self) -> models.Model | None:
        return getattr(self, self.scope_kind, None)

    def clean(self) -> None:
        """The scope, then the limit's shape and values exactly as ``loadconfig`` checks them."""
        errors: dict[str, list[str]] = {}
        set_scopes = [f for f in self.SCOPE_FIELDS if getattr(self, f"{f}_id") is not None]
        # An empty or unknown kind is already refused by the field itself.
        if self.scope_kind in self.SCOPE_FIELDS and set_scopes != [self.scope_kind]:
            label = self.ScopeKind(self.scope_kind).label
            errors["scope_kind"] = [
                f"exactly one scope must be set: the {label} ({self.scope_kind}), no other"
            ]
        values = {field: getattr(self, field) for field in self.LIMIT_FIELDS}
        for field, value in bucket_defaults(values).items():
            setattr(self, field, value)
            values[field] = value
        for field, messages in bucket_errors(values, name=self.name).items():
            errors.setdefault(field, []).extend(messages)
        if errors:
            raise ValidationError(errors)


class Reservation(models.Model):
    """C8: the ledger record of one reservation (one attempt of a request), off the hot path.

    Redis holds live reservations as leases; this table is the system of record of what was
    reserved, from which buckets, and how reconciliation settled it.
    """

    class Outcome(models.TextChoices):
        RECONCILED = "reconciled"
        RELEASED = "released", "released unused"
        EXPIRED = "expired", "lease expired"
        REFUSED = "refused"

    id = models.CharField(max_length=64, primary_key=True)  # the reservation id
    request_id = models.CharField(max_length=40, db_index=True)
    idempotency_key = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True)
    queue_deadline = models.DateTimeField(null=True)
    # Empty for a lease reaped after its gateway died: the lease record knows only its buckets.
    tenant_id = models.BigIntegerField(null=True)
    app_id = models.BigIntegerField(null=True)
    api_key_id = models.BigIntegerField(null=True)
    model = models.CharField(max_length=200, blank=True, default="")
    provider = models.CharField(max_length=100, blank=True, default="")
    workload_class = models.CharField(max_length=50, blank=True, default="")
    estimated_input_tokens = models.PositiveIntegerField(default=0)
    estimated_output_tokens = models.PositiveIntegerField(default=0)
    estimated_total_tokens = models.PositiveIntegerField(default=0)
    estimated_spend = models.DecimalField(max_digits=14, decimal_places=8, default=0)
    taken = models.JSONField(default=dict, help_text="Amount taken per bucket (public name).")
    outcome = models.CharField(max_length=12, choices=Outcome.choices)
    reason_code = models.CharField(max_length=64, blank=True, default="")
    queue_wait_ms = models.FloatField(default=0)
    actual_input_tokens = models.PositiveIntegerField(null=True)
    actual_cached_input_tokens = models.PositiveIntegerField(null=True)
    actual_output_tokens = models.PositiveIntegerField(null=True)
    actual_spend = models.DecimalField(max_digits=14, decimal_places=8, null=True)
    settled = models.JSONField(
        default=dict, help_text="Per bucket: released (negative) or charged beyond the estimate."
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant_id", "-created_at"], name="reservation_tenant_recent")
        ]

    def __str__(self) -> str:
        return self.id


class BrokerMember(models.Model):
    """A process that can hold reservations (a gateway process, a Celery worker's job loop),
    as it last said it was alive. After Redis lost its state, the members' rows tell a new
    deployment from a lost one and whose reservations may still be in flight
    (``quotas.core.recovery``). Times are epoch seconds on the Redis clock, as the leases'."""

    id = models.CharField(max_length=120, primary_key=True)
    started = models.FloatField()
    last_seen = models.FloatField()

    class Meta:
        verbose_name = "broker member"

    def __str__(self) -> str:
        return self.id
