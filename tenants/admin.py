"""Admin for the hierarchy (A1) and API keys (A2): a new key's secret is shown once, on the page
that answers the form, and stored only as its hash.

Tenant members (A4, ``tenants/scoping.py``) see their own tenant, and edit its teams, apps and
keys; partners and memberships are platform-only.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html

from common.durations import duration_format
from tenants.admin_base import ConfigModelAdmin, config_changed
from tenants.keys import key_generate, key_hash, key_prefix
from tenants.lifecycle import key_revoke, key_rotate
from tenants.models import ApiKey, App, Partner, Team, Tenant, TenantMembership
from tenants.onboarding import NotATenantUser, tenant_admin_make
from tenants.scoping import Access, TenantScopedAdmin, TenantScopedInline, tenant_member


@admin.register(Partner)
class PartnerAdmin(ConfigModelAdmin):
    # Explicit: a Count annotation drops Meta.ordering, and autocomplete pages need an order.
    ordering = ["name"]
    list_display = ["name", "tenant_count", "created_at"]
    search_fields = ["name"]
    readonly_fields = ["created_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Partner]:
        return super().get_queryset(request).annotate(tenant_count=Count("tenants"))

    @admin.display(description="tenants", ordering="tenant_count")
    def tenant_count(self, partner: Any) -> int:
        return int(partner.tenant_count)


class TenantAdminForm(forms.Form):
    email = forms.EmailField(help_text="Also the account's username.")
    role = forms.ChoiceField(
        choices=TenantMembership.Role.choices, initial=TenantMembership.Role.ADMIN
    )


class TeamInline(TenantScopedInline, admin.TabularInline):  # type: ignore[type-arg]
    model = Team
    extra = 0
    fields = ["name"]
    show_change_link = True
    tenant_access = Access.EDIT


@admin.register(Tenant)
class TenantAdmin(ConfigModelAdmin):
    ordering = ["name"]
    list_display = [
        "name",
        "partner",
        "weight",
        "default_sort",
        "is_active",
        "team_count",
        "activity",
        "saturation",
    ]
    list_filter = ["is_active", "default_sort", ("partner", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["name"]
    autocomplete_fields = ["partner"]
    list_select_related = ["partner"]
    fields = [
        "name",
        "partner",
        "weight",
        "default_sort",
        "is_active",
        "created_at",
        "activity",
        "saturation",
    ]
    readonly_fields = ["created_at", "activity", "saturation"]
    inlines = [TeamInline]
    actions = ["make_tenant_admin"]
    # A member sees their own tenant and may pick its default sort (G13); its name, weight
    # (its share of contended capacity, D2), state and reseller are the platform's to set.
    tenant_lookup = "pk"
    tenant_access = Access.CHANGE
    tenant_hidden_fields = ("partner",)
    tenant_readonly_fields = ("name", "weight", "is_active")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tenant]:
        return super().get_queryset(request).annotate(team_count=Count("teams"))

    @admin.display(description="teams", ordering="team_count")
    def team_count(self, tenant: Any) -> int:
        return int(tenant.team_count)

    @admin.display(description="activity")
    def activity(self, tenant: Tenant) -> str:
        if tenant.pk is None:
            return "—"
        url = reverse("ops:tenant-activity", args=[tenant.name])
        return format_html('<a href="{}">recent requests</a>', url)

    @admin.display(description="saturation")
    def saturation(self, tenant: Tenant) -> str:
        if tenant.pk is None:
            return "—"
        url = reverse("ops:tenant-saturation", args=[tenant.name])
        return format_html('<a href="{}">limits and charts</a>', url)

    def has_membership_permission(self, request: HttpRequest) -> bool:
        # Making members is the platform's: tenant members never see the memberships.
        return tenant_member(request.user) is None and bool(
            request.user.has_perm("tenants.add_tenantmembership")
        )

    @admin.action(
        description="Make a tenant admin of the selected tenant…", permissions=["membership"]
    )
    def make_tenant_admin(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> Any:
        """What ``manage.py tenant_admin TENANT EMAIL`` does, from a form in the admin."""
        tenants = list(queryset[:2])
        if len(tenants) != 1:
            self.message_user(request, "Select exactly one tenant.", messages.WARNING)
            return None
        tenant = tenants[0]
        form = TenantAdminForm(request.POST if "email" in request.POST else None)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Make a tenant admin of {tenant.name}",
            "tenant": tenant,
            "form": form,
            "grant": None,
        }
        if form.is_valid():
            try:
                grant = tenant_admin_make(tenant=tenant, **form.cleaned_data)
            except NotATenantUser as error:
                form.add_error("email", str(error))
            else:
                self.log_change(request, tenant, f"Made {grant.user.username} a member.")
                context["grant"] = grant
        response = TemplateResponse(request, "admin/tenants/tenant/make_tenant_admin.html", context)
        add_never_cache_headers(response)  # it may show a generated password
        return response


# A workload class sets a request's weight and queue contract: the platform assigns it.
MEMBER_READONLY_APP_FIELDS = ("default_workload",)


class AppInline(TenantScopedInline, admin.TabularInline):  # type: ignore[type-arg]
    model = App
    extra = 0
    fields = ["name", "environment", "default_workload"]
    autocomplete_fields = ["default_workload"]
    show_change_link = True
    tenant_access = Access.EDIT
    tenant_readonly_fields = MEMBER_READONLY_APP_FIELDS


@admin.register(Team)
class TeamAdmin(ConfigModelAdmin):
    ordering = ["tenant__name", "name"]
    list_display = ["name", "tenant", "app_count"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["name", "tenant__name"]
    autocomplete_fields = ["tenant"]
    list_select_related = ["tenant"]
    inlines = [AppInline]
    tenant_lookup = "tenant_id"
    tenant_access = Access.EDIT

    def get_queryset(self, request: HttpRequest) -> QuerySet[Team]:
        return super().get_queryset(request).annotate(app_count=Count("apps"))

    @admin.display(description="apps", ordering="app_count")
    def app_count(self, team: Any) -> int:
        return int(team.app_count)


class ApiKeyInline(TenantScopedInline, admin.TabularInline):  # type: ignore[type-arg]
    """The app's keys, read-only: a key is added on its own page, where its secret is shown."""

    model = ApiKey
    extra = 0
    fields = ["name", "prefix", "created_at", "expires_at", "revoked_at"]
    readonly_fields = fields
    show_change_link = True
    can_delete = False
    tenant_access = Access.VIEW

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(App)
class AppAdmin(ConfigModelAdmin):
    ordering = ["team__tenant__name", "team__name", "name"]
    list_display = ["name", "team", "tenant", "environment", "default_workload", "key_count"]
    list_filter = [
        "environment",
        ("default_workload", admin.RelatedOnlyFieldListFilter),
        ("team__tenant", admin.RelatedOnlyFieldListFilter),
    ]
    search_fields = ["name", "team__name", "team__tenant__name"]
    autocomplete_fields = ["team", "default_workload"]
    list_select_related = ["team__tenant", "default_workload"]
    inlines = [ApiKeyInline]
    tenant_lookup = "team__tenant_id"
    tenant_access = Access.EDIT
    tenant_readonly_fields = MEMBER_READONLY_APP_FIELDS

    def get_queryset(self, request: HttpRequest) -> QuerySet[App]:
        return super().get_queryset(request).annotate(key_count=Count("keys"))

    @admin.display(description="tenant", ordering="team__tenant__name")
    def tenant(self, app: App) -> Tenant:
        return app.team.tenant

    @admin.display(description="keys", ordering="key_count")
    def key_count(self, app: Any) -> int:
        return int(app.key_count)


class ApiKeyStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("active", "active"), ("expired", "expired"), ("revoked", "revoked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> QuerySet[ApiKey]:
        now = timezone.now()
        live = Q(revoked_at__isnull=True)
        if self.value() == "active":
            return queryset.filter(live & (Q(expires_at__isnull=True) | Q(expires_at__gt=now)))
        if self.value() == "expired":
            return queryset.filter(live & Q(expires_at__lte=now))
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


@admin.register(ApiKey)
class ApiKeyAdmin(ConfigModelAdmin):
    list_display = [
        "prefix",
        "name",
        "app",
        "tenant",
        "created_at",
        "expires_at",
        "revoked_at",
        "status",
    ]
    list_filter = [
        ApiKeyStatusFilter,
        "app__environment",
        ("app__team__tenant", admin.RelatedOnlyFieldListFilter),
    ]
    search_fields = ["prefix", "name", "app__name", "app__team__name", "app__team__tenant__name"]
    autocomplete_fields = ["app"]
    list_select_related = ["app__team__tenant"]
    actions = ["revoke_keys", "rotate_keys", "rotate_keys_now"]
    tenant_lookup = "app__team__tenant_id"
    tenant_access = Access.EDIT

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        editable = ["app", "name", "allowed_models", "expires_at"]
        if obj is None:
            return editable
        return [
            "prefix",
            *editable,
            "created_at",
            "revoked_at",
            "previous_valid_until",
            "status",
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        if obj is None:
            return []
        # Moving a key to another app would move it to another tenant: add a new key instead.
        return ["prefix", "app", "created_at", "revoked_at", "previous_valid_until", "status"]

    @admin.display(description="tenant", ordering="app__team__tenant__name")
    def tenant(self, key: ApiKey) -> Tenant:
        return key.tenant

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A2: keys are revoked, never deleted (ledger rows name them). Without this permission
        # Django's delete pages also refuse an app, team or tenant that still has keys.
        return False

    @admin.display(description="old secret works until")
    def previous_valid_until(self, key: ApiKey) -> str:
        if not key.previous_secret_hash or key.previous_valid_until is None:
            return "—"
        if key.previous_valid_until <= timezone.now():
            return "— (overlap ended)"
        return f"{key.previous_valid_until:%Y-%m-%d %H:%M:%S} UTC ({key.previous_prefix}…)"

    @admin.display(description="status")
    def status(self, key: ApiKey) -> str:
        if key.revoked_at is not None:
            return "revoked"
        return "active" if key.is_usable(timezone.now()) else "expired"

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if not change:
            secret = key_generate()
            obj.secret_hash, obj.prefix = key_hash(secret), key_prefix(secret)
            obj._secret_shown_once = secret  # type: ignore[attr-defined]  # for response_add only
        super().save_model(request, obj, form, change)

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        """The answer to the add form is the only page that ever shows the secret."""
        secret = getattr(obj, "_secret_shown_once", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        opts = self.opts
        context = {
            **self.admin_site.each_context(request),
            "opts": opts,
            "title": "API key created",
            "key": obj,
            "secret": secret,
            "change_url": reverse("admin:tenants_apikey_change", args=[obj.pk]),
            "add_url": reverse("admin:tenants_apikey_add"),
            "changelist_url": reverse("admin:tenants_apikey_changelist"),
        }
        response = TemplateResponse(request, "admin/tenants/apikey/secret_once.html", context)
        add_never_cache_headers(response)
        return response

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        now = timezone.now()
        live = list(queryset.filter(revoked_at__isnull=True))
        for key in live:
            key_revoke(key, now=now)
            self.log_change(request, key, "Revoked.")
        config_changed()
        self.message_user(request, f"Revoked {len(live)} key(s).", messages.SUCCESS)

    @admin.action(
        description="Rotate selected keys (the old secrets work for the overlap)",
        permissions=["change"],
    )
    def rotate_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> HttpResponse:
        return self._rotate(request, queryset, settings.KEY_ROTATION_OVERLAP_SECONDS)

    @admin.action(
        description="Rotate selected keys now (the old secrets stop at once)",
        permissions=["change"],
    )
    def rotate_keys_now(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> HttpResponse:
        return self._rotate(request, queryset, 0)

    def _rotate(
        self, request: HttpRequest, queryset: QuerySet[ApiKey], overlap_seconds: float
    ) -> HttpResponse:
        """New secrets, shown on the page that answers the action, as for a new key."""
        now = timezone.now()
        issued = []
        for key in queryset.filter(revoked_at__isnull=True).select_related("app__team__tenant"):
            secret = key_rotate(key, now=now, overlap_seconds=overlap_seconds)
            self.log_change(request, key, "Rotated.")
            issued.append((key, secret))
        config_changed()
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "API keys rotated",
            "issued": issued,
            "overlap": duration_format(overlap_seconds) if overlap_seconds > 0 else "",
            "changelist_url": reverse("admin:tenants_apikey_changelist"),
        }
        response = TemplateResponse(request, "admin/tenants/apikey/rotated_once.html", context)
        add_never_cache_headers(response)
        return response


@admin.register(TenantMembership)
class TenantMembershipAdmin(TenantScopedAdmin):  # not configuration: no reload on save
    """Platform staff make users tenant members (A4); members never see this page."""

    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", ("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["user__username", "user__email", "tenant__name"]
    autocomplete_fields = ["user", "tenant"]
    list_select_related = ["user", "tenant"]
    readonly_fields = ["created_at"]

    def save_model(
        self, request: HttpRequest, obj: TenantMembership, form: Any, change: bool
    ) -> None:
        super().save_model(request, obj, form, change)
        if not obj.user.is_staff:  # a member signs in to the same admin
            obj.user.is_staff = True
            obj.user.save(update_fields=["is_staff"])
