"""The admin is the other way to change the configuration: every save or delete made there
tells the gateway processes to reload, exactly as ``loadconfig`` does."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models, transaction
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest

from common.redis import config_version_bump


def config_changed() -> None:
    """Bump the configuration version once the current transaction commits."""
    # robust: a Redis outage must not turn a committed admin save into an error page.
    transaction.on_commit(config_version_bump, robust=True)


class ConfigChangeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Base of every configuration model's admin: saves and deletes bump the config version.

    ``save_related`` runs after ``save_model`` in the change form and in list editing, and
    saves the inlines, so it is the one place a save is complete.
    """

    def save_related(
        self, request: HttpRequest, form: ModelForm, formsets: Any, change: bool
    ) -> None:
        super().save_related(request, form, formsets, change)
        config_changed()

    def delete_model(self, request: HttpRequest, obj: models.Model) -> None:
        super().delete_model(request, obj)
        config_changed()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        super().delete_queryset(request, queryset)
        config_changed()

    def get_inline_instances(
        self, request: HttpRequest, obj: models.Model | None = None
    ) -> list[Any]:
        # Inlines whose rows need their parent's id to validate (buckets) appear once it exists.
        inlines = super().get_inline_instances(request, obj)
        if obj is None:
            inlines = [i for i in inlines if not getattr(i, "needs_saved_parent", False)]
        return inlines
