"""The activity page's filters: app, key, model, provider, status and time range of the
tenant's requests."""

from __future__ import annotations

from typing import Any

from django import forms

from routing.models import Model, Provider
from tenants.models import ApiKey, App, Tenant

STATUS_CHOICES = [
    ("", "any status"),
    ("ok", "succeeded (below 400)"),
    ("4xx", "refused or invalid (4xx)"),
    ("429", "refused for capacity (429)"),
    ("5xx", "failed (5xx)"),
]
FILTERS = ("app", "key", "model", "provider", "status", "since", "until")


class ActivityFilterForm(forms.Form):
    app = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    key = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    model = forms.ChoiceField(required=False)
    provider = forms.ChoiceField(required=False)
    status = forms.ChoiceField(required=False, choices=STATUS_CHOICES)
    since = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    until = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )

    def __init__(self, *args: Any, tenant: Tenant, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The catalogue is public to every tenant (model slugs and provider names only); apps
        # and keys are the page's tenant's alone.
        models = Model.objects.order_by("slug").values_list("slug", flat=True)
        providers = Provider.objects.order_by("name").values_list("name", flat=True)
        apps = App.objects.filter(team__tenant=tenant).select_related("team")
        keys = ApiKey.objects.filter(app__team__tenant=tenant).select_related("app")
        self.fields["app"].choices = [
            ("", "any app"),
            *((a.pk, f"{a.team.name}/{a.name}") for a in apps),
        ]
        self.fields["key"].choices = [
            ("", "any key"),
            *((k.pk, f"{k.prefix}… {k.app.name}/{k.name}") for k in keys),
        ]
        self.fields["model"].choices = [("", "any model"), *((m, m) for m in models)]
        self.fields["provider"].choices = [("", "any provider"), *((p, p) for p in providers)]

    def filters(self) -> dict[str, Any]:
        """The valid filters; an invalid one is dropped (the form shows its error)."""
        if not self.is_bound:
            return {}
        self.is_valid()
        data = getattr(self, "cleaned_data", {})
        return {name: data[name] for name in FILTERS if data.get(name) not in (None, "")}

    def query(self) -> dict[str, str]:
        """The valid filters as the page's query string has them (for links to other pages)."""
        return {name: self.data[name] for name in self.filters()}
