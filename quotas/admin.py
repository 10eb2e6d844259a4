"""Admin for workload classes and buckets; ``bucket_inline`` puts a scope's buckets on its page.

Tenant members (SPEC A4) see their tenant's buckets and edit those of their teams, apps and keys;
the tenant-wide buckets are the platform's limits on the tenant, shown to them read-only, and
partner, provider and model buckets are not shown at all.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db import models
from django.db.models import Q
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from common.durations import duration_format
from quotas.levels import bucket_level_text
from quotas.models import Bucket, WorkloadClass
from quotas.names import bucket_qualifier, endpoint_scope_label, scope_name
from routing import admin as routing_admin
from tenants import admin as tenants_admin
from tenants.admin_base import ConfigModelAdmin
from tenants.scoping import Access, TenantScopedInline, tenant_member

# Scopes whose buckets a tenant admin may add, change and delete: inside their own tenant, so the
# tenant-wide buckets above still cap them.
MEMBER_SCOPES = ("team", "app", "api_key")
# The path from each tenant-owned scope to its tenant's id.
TENANT_SCOPE_LOOKUPS = {
    "tenant": "tenant_id",
    "team": "team__tenant_id",
    "app": "app__team__tenant_id",
    "api_key": "api_key__app__team__tenant_id",
}


@admin.register(WorkloadClass)
class WorkloadClassAdmin(ConfigModelAdmin):
    list_display = [
        "name",
        "deadline_seconds",
        "max_queue_depth",
        "overload_action",
        "weight",
        "retry_budget",
        "stream_reservation",
        "stream_step_tokens",
    ]
    list_filter = ["overload_action", "stream_reservation"]
    search_fields = ["name"]


# The limit's own fields, shadow aside (it sits with the name, as a trial switch).
LIMIT_FIELDS = [f for f in Bucket.LIMIT_FIELDS if f != "shadow"]

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
    elif kind in ("credential", "project"):
        names = [owner.provider.name, owner.name]  # type: ignore[attr-defined]
    elif kind == "endpoint":
        names = [endpoint_scope_label(owner.model.slug, owner.provider.name)]  # type: ignore[attr-defined]
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

    # Set for tenant members: a name they give must start with its scope's path. Names are
    # unique across tenants, so a free name could collide with another tenant's bucket and the
    # "already exists" error would reveal it.
    scoped_names = False

    name = forms.CharField(
        max_length=200,
        required=False,
        help_text="Public: shown in response headers. Leave blank to derive it, "
        "e.g. team:example/search:requests:1m.",
    )

    class Meta:
        model = Bucket
        fields = [*SCOPED_FIELDS, "scope_kind", *Bucket.SCOPE_FIELDS]

    def scope(self) -> tuple[str, models.Model | None]:
        # On a change page the kind is read-only, so it is the instance's.
        kind = self.cleaned_data.get("scope_kind") or self.instance.scope_kind or ""
        if not kind:
            return "", None
        if kind in self.cleaned_data:
            return kind, self.cleaned_data[kind]
        return kind, getattr(self.instance, kind, None)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind, owner = self.scope()
        if not data.get("name") and owner is not None:
            data["name"] = bucket_default_name(kind, owner, data)
        elif self.scoped_names and owner is not None and "name" in self.changed_data:
            prefix = f"{scope_path(kind, owner)}:"
            if not data["name"].startswith(prefix):
                self.add_error("name", f"The name must start with its scope, {prefix}")
        return data


def scoped_names_form(form: type[BucketForm]) -> type[BucketForm]:
    return type(form.__name__, (form,), {"scoped_names": True})


@admin.register(Bucket)
class BucketAdmin(ConfigModelAdmin):
    form = BucketForm
    tenant_access = Access.EDIT
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
        "credential__provider",
        "project__provider",
        "endpoint__provider",
        "endpoint__model",
        "provider",
        "model",
    ]
    # The scope is one plain select of the chosen kind's objects (see get_fieldsets): it works
    # without JavaScript, and a member's choices are their own tenant's.
    fieldsets = [
        (None, {"fields": ["name", "source", "shadow"]}),
        ("Scope", {"fields": ["scope_kind", *Bucket.SCOPE_FIELDS]}),
        ("Limit", {"fields": LIMIT_FIELDS}),
    ]

    @admin.display(description="scope")
    def scope(self, bucket: Bucket) -> str:
        return str(bucket.scope_object() or "—")

    def tenant_filter(self, tenant_id: int) -> Q:
        scoped = Q(pk__in=[])
        for kind, lookup in TENANT_SCOPE_LOOKUPS.items():
            scoped |= Q(scope_kind=kind, **{lookup: tenant_id})
        return scoped

    def tenant_editable(self, obj: Bucket) -> bool:
        return obj.scope_kind in MEMBER_SCOPES

    def get_fieldsets(self, request: HttpRequest, obj: Bucket | None = None) -> Any:
        """The scope part asks for one scope: the kind, then the one field of that kind (the
        bucket's own on its change page; on the add page the kind chosen by a link or posted)."""
        fieldsets = super().get_fieldsets(request, obj)
        kind = self.scope_kind_of(request, obj)
        scope_fields = ["scope_kind", *([kind] if kind else [])]
        live = ["live_level"] if obj is not None else []
        description = None if kind else self.scope_kind_links(request)
        return [
            (name, {**options, "fields": scope_fields, "description": description})
            if name == "Scope"
            else (name, {**options, "fields": [*options["fields"], *live]})
            if name is None
            else (name, options)
            for name, options in fieldsets
        ]

    def scope_kind_of(self, request: HttpRequest, obj: Bucket | None) -> str:
        """The scope kind this page asks for, if it is one the reader may use."""
        if obj is not None:
            kind = obj.scope_kind
        else:
            kind = (request.POST if request.method == "POST" else request.GET).get("scope_kind", "")
        if kind not in Bucket.SCOPE_FIELDS:
            return ""
        member = tenant_member(request.user) is not None
        if member and obj is None and kind not in MEMBER_SCOPES:
            return ""
        return kind

    def scope_kind_links(self, request: HttpRequest) -> str:
        kinds = [
            (value, label)
            for value, label in Bucket.ScopeKind.choices
            if tenant_member(request.user) is None or value in MEMBER_SCOPES
        ]
        links = format_html_join(
            " · ", '<a href="?scope_kind={}">{}</a>', ((v, label) for v, label in kinds)
        )
        return format_html("A limit applies to one scope. Add one for: {}", links)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None:
            # Another scope is another limit: add it anew (names and levels follow the scope).
            fields += [f for f in ("scope_kind", *Bucket.SCOPE_FIELDS) if f not in fields]
        return [*fields, "live_level"]

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial = super().get_changeform_initial_data(request)
        if request.GET.get("scope_kind") not in Bucket.SCOPE_FIELDS:
            initial.pop("scope_kind", None)
        return initial

    @admin.display(description="live level")
    def live_level(self, bucket: Bucket) -> str:
        if bucket.pk is None:
            return "—"
        return bucket_level_text(bucket)

    def formfield_for_choice_field(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "scope_kind" and tenant_member(request.user) is not None:
            kwargs["choices"] = [("", "---------")] + [
                (value, label) for value, label in db_field.choices if value in MEMBER_SCOPES
            ]
        return super().formfield_for_choice_field(db_field, request, **kwargs)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if tenant_member(request.user) is not None:
            kwargs["form"] = scoped_names_form(self.form)
        return super().get_form(request, obj, change, **kwargs)

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


class BucketInline(TenantScopedInline, admin.TabularInline):  # type: ignore[type-arg]
    model = Bucket
    extra = 0
    # A new bucket needs its scope's id to validate: shown once the parent exists.
    needs_saved_parent = True
    fields = SCOPED_FIELDS

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        if tenant_member(request.user) is not None:
            kwargs["form"] = scoped_names_form(self.form)
        return super().get_formset(request, obj, **kwargs)


def bucket_inline(scope_kind: str) -> type[BucketInline]:
    """An inline listing the buckets whose scope is the page's object."""
    form = type(
        f"{scope_kind.title()}BucketForm", (_ScopedBucketForm,), {"scope_kind_fixed": scope_kind}
    )
    if scope_kind in MEMBER_SCOPES:
        access = Access.EDIT
    else:
        access = Access.VIEW if scope_kind in TENANT_SCOPE_LOOKUPS else Access.NONE
    attrs = {
        "fk_name": scope_kind,
        "form": form,
        "verbose_name_plural": "limits (buckets)",
        "tenant_access": access,
    }
    return type(f"{scope_kind.title()}BucketInline", (BucketInline,), attrs)


# The tenant-side and provider-side pages are drawn by tenants/admin.py and routing/admin.py;
# the buckets they list are quotas' rows, so quotas adds the inline to each page (last, below
# the page's own inlines).
for page, scope_kind in (
    (tenants_admin.PartnerAdmin, "partner"),
    (tenants_admin.TenantAdmin, "tenant"),
    (tenants_admin.TeamAdmin, "team"),
    (tenants_admin.AppAdmin, "app"),
    (tenants_admin.ApiKeyAdmin, "api_key"),
    (routing_admin.ProviderAdmin, "provider"),
    (routing_admin.ProviderProjectAdmin, "project"),
    (routing_admin.CredentialAdmin, "credential"),
    (routing_admin.EndpointAdmin, "endpoint"),
    (routing_admin.RouteModelAdmin, "model"),
):
    page.inlines = [*page.inlines, bucket_inline(scope_kind)]
