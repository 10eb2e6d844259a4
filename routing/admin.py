"""Admin for the catalogue: providers (credential write-only), their projects and key pools
(SPEC B2: each key write-only, with its own limits on the bucket pages), models and their
endpoints.

Tenant members (A4) may read the catalogue — models, endpoints, prices — but never providers
(accounts and credentials) nor the provider- and model-scoped buckets.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from routing.models import Credential, Endpoint, Model, Provider, ProviderProject
from tenants import admin as tenants_admin
from tenants.admin_base import ConfigModelAdmin
from tenants.models import ApiKey
from tenants.scoping import Access, TenantScopedInline


class ProviderForm(forms.ModelForm):  # type: ignore[type-arg]
    """The credential can be replaced or cleared here, never read back."""

    api_key = forms.CharField(
        label="API key",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Stored encrypted. Leave blank to keep the current key.",
    )
    # assume_scheme: Django 6's default, stated now (and silences its deprecation warning).
    base_url = forms.URLField(max_length=500, assume_scheme="https")
    clear_api_key = forms.BooleanField(
        label="Remove the API key", required=False, help_text="Store no credential."
    )

    class Meta:
        model = Provider
        fields = [
            "name",
            "protocol",
            "base_url",
            "cache_ttl_seconds",
            "learn_concurrency",
            "is_active",
        ]


class CredentialForm(forms.ModelForm):  # type: ignore[type-arg]
    """A pool key's secret can be replaced here, never read back."""

    api_key = forms.CharField(
        label="API key",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Stored encrypted. Leave blank to keep the current key.",
    )

    class Meta:
        model = Credential
        fields = ["provider", "name", "project", "is_active"]

    def save(self, commit: bool = True) -> Credential:
        credential: Credential = super().save(commit=False)
        if self.cleaned_data.get("api_key"):
            credential.set_api_key(self.cleaned_data["api_key"])
        if commit:
            credential.save()
        return credential


class CredentialInline(admin.TabularInline):  # type: ignore[type-arg]
    """The organisation's key pool on its provider page (B2)."""

    model = Credential
    form = CredentialForm
    extra = 0
    fields = ["name", "project", "api_key", "is_active"]
    show_change_link = True


class ProviderProjectInline(admin.TabularInline):  # type: ignore[type-arg]
    model = ProviderProject
    extra = 0
    fields = ["name"]
    show_change_link = True


@admin.register(Credential)
class CredentialAdmin(ConfigModelAdmin):
    """One key of a provider's pool: its limits are buckets of scope "provider API key"; turn
    it off to take it out of the pool (the gateway also takes a key out by itself, for a while,
    when the provider answers it 401 or 403)."""

    form = CredentialForm
    fields = ["provider", "name", "project", "api_key", "is_active"]
    list_display = ["__str__", "provider", "project", "has_secret", "is_active"]
    list_filter = ["provider", "is_active"]
    search_fields = ["name", "provider__name"]
    list_select_related = ["provider", "project"]
    ordering = ["provider__name", "name"]

    @admin.display(description="secret", boolean=True)
    def has_secret(self, credential: Credential) -> bool:
        return bool(credential.api_key_encrypted)


@admin.register(ProviderProject)
class ProviderProjectAdmin(ConfigModelAdmin):
    list_display = ["__str__", "provider"]
    list_filter = ["provider"]
    search_fields = ["name", "provider__name"]
    list_select_related = ["provider"]
    ordering = ["provider__name", "name"]


@admin.register(Provider)
class ProviderAdmin(ConfigModelAdmin):
    # Explicit: a Count annotation drops Meta.ordering, and autocomplete pages need an order.
    ordering = ["name"]
    form = ProviderForm
    fields = [
        "name",
        "protocol",
        "base_url",
        "api_key",
        "clear_api_key",
        "cache_ttl_seconds",
        "learn_concurrency",
        "is_active",
    ]
    list_display = [
        "name",
        "protocol",
        "base_url",
        "has_credential",
        "endpoint_count",
        "cache_ttl_seconds",
        "is_active",
    ]
    list_filter = ["protocol", "is_active"]
    search_fields = ["name", "base_url"]
    inlines = [ProviderProjectInline, CredentialInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Provider]:
        return super().get_queryset(request).annotate(endpoint_count=Count("endpoints"))

    @admin.display(description="credential", boolean=True)
    def has_credential(self, provider: Provider) -> bool:
        return bool(provider.api_key_encrypted)

    @admin.display(description="endpoints", ordering="endpoint_count")
    def endpoint_count(self, provider: Any) -> int:
        return int(provider.endpoint_count)

    def save_model(self, request: HttpRequest, obj: Provider, form: Any, change: bool) -> None:
        if form.cleaned_data.get("api_key"):
            obj.set_api_key(form.cleaned_data["api_key"])
        elif form.cleaned_data.get("clear_api_key"):
            obj.set_api_key("")
        super().save_model(request, obj, form, change)


class EndpointInline(TenantScopedInline, admin.TabularInline):  # type: ignore[type-arg]
    model = Endpoint
    extra = 0
    tenant_access = Access.VIEW
    fields = [
        "position",
        "provider",
        "upstream_model",
        "price_input",
        "price_cached_input",
        "price_output",
        "context_window",
        "max_output",
        "supports",
        "region",
        "batch_api",
        "batch_discount",
        "batch_turnaround_seconds",
        "is_active",
    ]
    autocomplete_fields = ["provider"]
    ordering = ["position"]


class AliasesField(forms.CharField):
    """A model's aliases as a person types them, ``claude-sonnet-4-5, gpt-4o``: the JSON list
    the model stores (its ``clean`` checks each name and that no other model has it)."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return ", ".join(str(name) for name in value)
        return value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value)
        return [name for name in (part.strip() for part in text.split(",")) if name]


class RouteModelForm(forms.ModelForm):  # type: ignore[type-arg]
    aliases = AliasesField(
        required=False,
        help_text="Other model ids clients may send for this model, separated by commas "
        "(e.g. claude-sonnet-4-5, gpt-4o).",
    )

    class Meta:
        model = Model
        fields = [
            "slug",
            "aliases",
            "default_output_tokens",
            "default_input_tokens",
            "allow_fallbacks",
            "fallback_model",
            "fallback_contract",
            "routing_parameters",
            "max_cost_premium",
            "is_active",
        ]


@admin.register(Model)
class RouteModelAdmin(ConfigModelAdmin):
    form = RouteModelForm
    ordering = ["slug"]
    list_display = [
        "slug",
        "alias_list",
        "default_output_tokens",
        "allow_fallbacks",
        "fallback_model",
        "endpoint_count",
        "is_active",
    ]
    list_filter = ["is_active", "allow_fallbacks", "endpoints__provider"]
    search_fields = ["slug"]
    autocomplete_fields = ["fallback_model"]
    list_select_related = ["fallback_model"]
    inlines = [EndpointInline]
    catalogue = True
    tenant_access = Access.VIEW

    def get_queryset(self, request: HttpRequest) -> QuerySet[Model]:
        return super().get_queryset(request).annotate(endpoint_count=Count("endpoints"))

    @admin.display(description="aliases")
    def alias_list(self, model: Model) -> str:
        return ", ".join(model.aliases or ())

    @admin.display(description="endpoints", ordering="endpoint_count")
    def endpoint_count(self, model: Any) -> int:
        return int(model.endpoint_count)


@admin.register(Endpoint)
class EndpointAdmin(ConfigModelAdmin):
    list_display = [
        "model",
        "provider",
        "upstream_model",
        "position",
        "price_input",
        "price_cached_input",
        "price_output",
        "context_window",
        "max_output",
        "batch_api",
        "is_active",
    ]
    list_filter = ["is_active", "provider", "batch_api"]
    search_fields = ["model__slug", "provider__name", "upstream_model"]
    autocomplete_fields = ["model", "provider"]
    list_select_related = ["model", "provider"]
    catalogue = True
    tenant_access = Access.VIEW


# An API key's page is drawn by tenants/admin.py; the models it may use are catalogue rows,
# so routing, which owns them, adds the field that picks them.
def catalogue_model_choices() -> list[tuple[str, str]]:
    """Every model slug of the catalogue (public to every tenant), read when a form is built."""
    rows = Model.objects.order_by("slug").values_list("slug", "is_active")
    return [(slug, slug if active else f"{slug} (inactive)") for slug, active in rows]


class AllowedModelsField(forms.MultipleChoiceField):
    """A key's ``allowed_models`` picked from the catalogue: a slug that is not there (a stale
    or forged form) is refused as ``loadconfig`` refuses it."""

    default_error_messages = {"invalid_choice": "unknown model '%(value)s'"}

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("widget", forms.CheckboxSelectMultiple)
        kwargs.setdefault(
            "help_text", "The models this key may use; none ticked means every model."
        )
        super().__init__(choices=catalogue_model_choices, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        # A row saved before validation may hold one slug as a plain string.
        return [value] if isinstance(value, str) else value


admin.site.unregister(ApiKey)


@admin.register(ApiKey)
class ApiKeyAdmin(tenants_admin.ApiKeyAdmin):
    """The key's page with its ``allowed_models`` picked from the catalogue."""

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "allowed_models":
            return AllowedModelsField(label="Allowed models")
        return super().formfield_for_dbfield(db_field, request, **kwargs)
