"""Admin for workload classes and buckets; ``bucket_inline`` puts a scope's buckets on its page."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db import models

from gateway.configfile.admin_base import ConfigModelAdmin
from gateway.configfile.durations import duration_format
from gateway.configfile.names import bucket_qualifier, scope_name
from quotas.models import Bucket, WorkloadClass


@admin.register(WorkloadClass)
class WorkloadClassAdmin(ConfigModelAdmin):
    list_display = [
        "name",
        "deadline_seconds",
        "max_queue_depth",
        "overload_action",
        "weight",
        "retry_budget",
    ]
    list_filter = ["overload_action"]
    search_fields = ["name"]


LIMIT_FIELDS = [
    "dimension",
    "rule",
    "capacity",
    "period_seconds",
    "window",
    "resets_at",
    "timezone",
    "duration_seconds",
    "factor",
]
SCOPED_FIELDS = ["name", *LIMIT_FIELDS, "source", "shadow"]


def scope_path(kind: str, owner: models.Model) -> str:
    """The bucket-name scope of ``owner``, as ``loadconfig`` names it (``app:acme/search/web``)."""
    names: list[str]
    if kind == "api_key":
        names = [*_app_names(owner.app), owner.name]  # type: ignore[attr-defined]
    elif kind == "app":
        names = _app_names(owner)
    elif kind == "team":
        names = [owner.tenant.name, owner.name]  # type: ignore[attr-defined]
    elif kind == "model":
        names = [owner.slug]  # type: ignore[attr-defined]
    else:
        names = [owner.name]  # type: ignore[attr-defined]
    return scope_name(kind, *names)


def _app_names(app: Any) -> list[str]:
    return [app.team.tenant.name, app.team.name, app.name]


def bucket_default_name(kind: str, owner: models.Model, data: dict[str, Any]) -> str:
    """The name ``loadconfig`` would give this limit, for a bucket added with a blank name."""
    qualifier = bucket_qualifier(
        dimension=data.get("dimension") or "",
        rule=data.get("rule") or "",
        period_seconds=data.get("period_seconds"),
        window=data.get("window") or "",
        duration_seconds=data.get("duration_seconds"),
    )
    suffix = ":shadow" if data.get("shadow") else ""
    return f"{scope_path(kind, owner)}:{qualifier}{suffix}"


class BucketForm(forms.ModelForm):  # type: ignore[type-arg]
    """A blank name is filled in from the scope and the limit's shape."""

    name = forms.CharField(
        max_length=200,
        required=False,
        help_text="Public: shown in response headers. Leave blank to derive it, "
        "e.g. tenant:acme:requests:1m.",
    )

    class Meta:
        model = Bucket
        fields = [*SCOPED_FIELDS, "scope_kind", *Bucket.SCOPE_FIELDS]

    def scope(self) -> tuple[str, models.Model | None]:
        kind = self.cleaned_data.get("scope_kind") or ""
        return kind, self.cleaned_data.get(kind) if kind else None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind, owner = self.scope()
        if not data.get("name") and owner is not None:
            data["name"] = bucket_default_name(kind, owner, data)
        return data


@admin.register(Bucket)
class BucketAdmin(ConfigModelAdmin):
    form = BucketForm
    list_display = [
        "name",
        "scope_kind",
        "scope",
        "dimension",
        "rule",
        "capacity",
        "period",
        "source",
        "shadow",
    ]
    list_filter = ["scope_kind", "dimension", "rule", "source", "shadow"]
    search_fields = ["name"]
    # Everything the scope column's str() touches.
    list_select_related = [
        "api_key",
        "app__team__tenant",
        "team__tenant",
        "tenant",
        "partner",
        "provider",
        "model",
    ]
    autocomplete_fields = [*Bucket.SCOPE_FIELDS]
    fieldsets = [
        (None, {"fields": ["name", "source", "shadow"]}),
        ("Scope", {"fields": ["scope_kind", *Bucket.SCOPE_FIELDS]}),
        ("Limit", {"fields": LIMIT_FIELDS}),
    ]

    @admin.display(description="scope")
    def scope(self, bucket: Bucket) -> str:
        return str(bucket.scope_object() or "—")

    @admin.display(description="period / window")
    def period(self, bucket: Bucket) -> str:
        return bucket_period(bucket)


def bucket_period(bucket: Bucket) -> str:
    """The limit's time shape in the file's words: ``per 1m``, ``day at 00:00 UTC``…"""
    if bucket.rule == Bucket.Rule.FIXED_WINDOW:
        at = bucket.resets_at.strftime("%H:%M") if bucket.resets_at else "00:00"
        return f"{bucket.window} at {at} {bucket.timezone}"
    if bucket.rule == Bucket.Rule.ROLLING_WINDOW and bucket.duration_seconds:
        return f"rolling {duration_format(bucket.duration_seconds)}"
    if bucket.rule == Bucket.Rule.RAMP and bucket.period_seconds:
        return f"×{bucket.factor:g} per {duration_format(bucket.period_seconds)}"
    if bucket.period_seconds:
        return f"per {duration_format(bucket.period_seconds)}"
    return "—"


class _ScopedBucketForm(BucketForm):
    scope_kind_fixed = ""

    class Meta:
        model = Bucket
        fields = SCOPED_FIELDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The inline's parent is the scope; the model's clean() checks exactly that scope is set.
        self.instance.scope_kind = self.scope_kind_fixed

    def scope(self) -> tuple[str, models.Model | None]:
        kind = self.scope_kind_fixed
        return kind, getattr(self.instance, kind, None)


class BucketInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Bucket
    extra = 0
    # A new bucket needs its scope's id to validate: shown once the parent exists.
    needs_saved_parent = True
    fields = SCOPED_FIELDS


def bucket_inline(scope_kind: str) -> type[BucketInline]:
    """An inline listing the buckets whose scope is the page's object."""
    form = type(
        f"{scope_kind.title()}BucketForm", (_ScopedBucketForm,), {"scope_kind_fixed": scope_kind}
    )
    attrs = {"fk_name": scope_kind, "form": form, "verbose_name_plural": "limits (buckets)"}
    return type(f"{scope_kind.title()}BucketInline", (BucketInline,), attrs)
