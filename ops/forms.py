"""The activity page's filters: model, provider and status of the tenant's requests."""

from __future__ import annotations

from typing import Any

from django import forms

from routing.models import Model, Provider

STATUS_CHOICES = [
    ("", "any status"),
    ("ok", "succeeded (below 400)"),
    ("4xx", "refused or invalid (4xx)"),
    ("429", "refused for capacity (429)"),
    ("5xx", "failed (5xx)"),
]


class ActivityFilterForm(forms.Form):
    model = forms.ChoiceField(required=False)
    provider = forms.ChoiceField(required=False)
    status = forms.ChoiceField(required=False, choices=STATUS_CHOICES)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The catalogue is public to every tenant (model slugs and provider names only).
        models = Model.objects.order_by("slug").values_list("slug", flat=True)
        providers = Provider.objects.order_by("name").values_list("name", flat=True)
        self.fields["model"].choices = [("", "any model"), *((m, m) for m in models)]
        self.fields["provider"].choices = [("", "any provider"), *((p, p) for p in providers)]

    def filters(self) -> dict[str, str]:
        """The valid filters; an invalid one is dropped (the form shows its error)."""
        if not self.is_bound:
            return {}
        self.is_valid()
        data = getattr(self, "cleaned_data", {})
        return {name: data[name] for name in ("model", "provider", "status") if data.get(name)}
