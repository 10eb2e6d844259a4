"""``loadconfig --prune``: remove what the file's sections manage but the file no longer names.

The file is the source of truth for each top-level section it contains, whoever created the
rows (the file or the admin); a section the file leaves out is not managed, so a catalogue file
and a tenants file can be pruned separately. What "remove" means depends on what refers to it:

- an API key is revoked, never deleted (the ledger refers to it by id);
- a limit (a configured bucket of a managed scope kind) and an endpoint are deleted: nothing
  refers to their rows (the ledger keeps provider and model names, not endpoint ids);
- an app, team or tenant is deleted unless keys or ledger rows refer to it (deleting it would
  delete its keys); then it is kept with its keys revoked and its limits gone, and a tenant
  is deactivated;
- a model is deleted unless a live key lists it in ``allowed_models`` (then deactivated); a
  provider unless endpoints still use it (then deactivated); a partner or workload class
  unless a tenant or app still refers to it (then kept: neither has an active flag).

Learned and provider-default buckets are the gateway's own, never the file's: left alone.
Every step compares before it writes, so a second run finds nothing to do.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from configfile.schema import Config
from configfile.scopes import scoped_limits
from quotas.models import Bucket, Reservation, WorkloadClass
from quotas.names import bucket_name
from routing.models import Credential, Endpoint, Model, Provider, ProviderProject
from tenants.models import ApiKey, App, Partner, Team, Tenant

SECTIONS = ("workload_classes", "providers", "models", "partners", "tenants")
REVOKED, DELETED, DEACTIVATED, KEPT = "revoked", "deleted", "deactivated", "kept"
# Which section manages the buckets of each scope kind.
_BUCKET_SECTIONS = {
    "credential": "providers",
    "project": "providers",
    "endpoint": "models",
    "provider": "providers",
    "model": "models",
    "partner": "partners",
    "tenant": "tenants",
    "team": "tenants",
    "app": "tenants",
    "api_key": "tenants",
}
_LISTED = 5  # how many referring objects a reason names


@dataclass(frozen=True)
class Removal:
    """One object the file no longer names and what pruning did to it; ``kept`` changes
    nothing (something still refers to it, said by ``reason``)."""

    kind: str
    label: str
    action: str
    reason: str = ""

    @property
    def changed(self) -> bool:
        return self.action != KEPT

    def line(self) -> str:
        reason = f" ({self.reason})" if self.reason else ""
        return f"{self.kind} {self.label}: {self.action}{reason}"


def config_prune(config: Config, sections: Iterable[str], *, now: dt.datetime) -> list[Removal]:
    """Remove what ``sections`` of ``config`` manage and the file does not name; run it in
    the transaction that applied ``config``."""
    pruner = _Pruner(config, frozenset(sections), now)
    pruner.run()
    return pruner.removals


class _Pruner:
    def __init__(self, config: Config, sections: frozenset[str], now: dt.datetime) -> None:
        self.config, self.sections, self.now = config, sections, now
        self.removals: list[Removal] = []

    def note(self, kind: str, label: str, action: str, reason: str = "") -> None:
        self.removals.append(Removal(kind, label, action, reason))

    def run(self) -> None:
        self.buckets()
        if "tenants" in self.sections:
            self.tenants()
        if "models" in self.sections:
            self.models()
        if "providers" in self.sections:
            self.providers()
        if "partners" in self.sections:
            self.partners()
        if "workload_classes" in self.sections:
            self.workload_classes()

    def buckets(self) -> None:
        kinds = [kind for kind, section in _BUCKET_SECTIONS.items() if section in self.sections]
        named = {bucket_name(scope, limit) for scope, limit in scoped_limits(self.config)}
        stale = Bucket.objects.filter(
            scope_kind__in=kinds, source=Bucket.Source.CONFIGURED
        ).exclude(name__in=named)
        for bucket in stale.order_by("name"):
            bucket.delete()
            self.note("limit", bucket.name, DELETED)

    def tenants(self) -> None:
        tenants = self.config.tenants
        keys = {
            (t.name, team.name, app.name, key.name)
            for t in tenants
            for team in t.teams
            for app in team.apps
            for key in app.keys
        }
        apps = {
            (t.name, team.name, app.name) for t in tenants for team in t.teams for app in team.apps
        }
        teams = {(t.name, team.name) for t in tenants for team in t.teams}
        names = {t.name for t in tenants}

        live = ApiKey.objects.filter(revoked_at__isnull=True).select_related("app__team__tenant")
        for key in live.order_by("app__team__tenant__name", "app__team__name", "app__name", "name"):
            path = (key.app.team.tenant.name, key.app.team.name, key.app.name, key.name)
            if path not in keys:
                key.revoked_at = self.now
                key.save(update_fields=["revoked_at"])
                self.note("api key", "/".join(path), REVOKED)

        for app in App.objects.select_related("team__tenant").order_by("pk"):
            app_path = (app.team.tenant.name, app.team.name, app.name)
            if app_path not in apps:
                self.delete_or_keep("app", "/".join(app_path), app, _history(app_id=app.pk))
        for team in Team.objects.select_related("tenant").order_by("pk"):
            team_path = (team.tenant.name, team.name)
            if team_path not in teams:
                history = _history(team_id=team.pk) or App.objects.filter(team=team).exists()
                self.delete_or_keep("team", "/".join(team_path), team, history)
        for tenant in Tenant.objects.exclude(name__in=names).order_by("name"):
            blocked = _history(tenant_id=tenant.pk) or Team.objects.filter(tenant=tenant).exists()
            if not blocked:
                tenant.delete()
                self.note("tenant", tenant.name, DELETED)
            else:
                self.deactivate(
                    "tenant", tenant.name, tenant, "kept for its API keys and ledger rows"
                )

    def delete_or_keep(self, kind: str, label: str, obj: App | Team, history: bool) -> None:
        """Delete an app or team unless keys (never deleted) or ledger rows refer to it."""
        keys = ApiKey.objects.filter(**{"app" if kind == "app" else "app__team": obj})
        if keys.exists() or history:
            why = "its API keys are revoked" if keys.exists() else "ledger rows refer to it"
            self.note(kind, label, KEPT, f"{why}; keys are never deleted")
            return
        obj.delete()
        self.note(kind, label, DELETED)

    def deactivate(
        self, kind: str, label: str, obj: Tenant | Model | Provider | Credential, why: str
    ) -> None:
        if obj.is_active:
            obj.is_active = False
            obj.save(update_fields=["is_active"])
            self.note(kind, label, DEACTIVATED, why)
        else:
            self.note(kind, label, KEPT, f"inactive, {why}")

    def models(self) -> None:
        named = {(m.slug, e.provider) for m in self.config.models for e in m.endpoints}
        endpoints = Endpoint.objects.select_related("model", "provider")
        for endpoint in endpoints.order_by("model__slug", "provider__name"):
            if (endpoint.model.slug, endpoint.provider.name) not in named:
                endpoint.delete()
                self.note("endpoint", f"{endpoint.model.slug}@{endpoint.provider.name}", DELETED)
        slugs = {m.slug for m in self.config.models}
        live_keys = ApiKey.objects.filter(revoked_at__isnull=True).select_related(
            "app__team__tenant"
        )
        for model in Model.objects.exclude(slug__in=slugs).order_by("slug"):
            users = [key for key in live_keys if model.slug in (key.allowed_models or [])]
            if users:
                listing = _listing(_key_label(key) for key in users)
                self.deactivate("model", model.slug, model, f"allowed_models of keys {listing}")
            else:
                model.delete()
                self.note("model", model.slug, DELETED)

    def providers(self) -> None:
        names = {p.name for p in self.config.providers}
        self.pools()
        for provider in Provider.objects.exclude(name__in=names).order_by("name"):
            users = Endpoint.objects.filter(provider=provider).select_related("model")
            if users.exists():
                listing = _listing(endpoint.model.slug for endpoint in users)
                self.deactivate(
                    "provider", provider.name, provider, f"endpoints of models {listing} use it"
                )
            else:
                provider.delete()
                self.note("provider", provider.name, DELETED)

    def pools(self) -> None:
        """A key or project of a provider in the file that the file no longer names: a key is
        deactivated (off the pool, its secret kept), a project deleted once no key uses it."""
        for spec in self.config.providers:
            keys = {k.name for k in spec.keys}
            stale = Credential.objects.filter(provider__name=spec.name, is_active=True)
            for credential in stale.exclude(name__in=keys).order_by("name"):
                self.deactivate("provider key", str(credential), credential, "not in the file")
            projects = {p.name for p in spec.projects}
            gone = ProviderProject.objects.filter(provider__name=spec.name)
            for project in gone.exclude(name__in=projects).order_by("name"):
                if project.credentials.exists():
                    Credential.objects.filter(project=project).update(project=None)
                project.delete()
                self.note("provider project", str(project), DELETED)

    def partners(self) -> None:
        names = {p.name for p in self.config.partners}
        for partner in Partner.objects.exclude(name__in=names).order_by("name"):
            users = Tenant.objects.filter(partner=partner).order_by("name")
            if users.exists():
                listing = _listing(tenant.name for tenant in users)
                self.note("partner", partner.name, KEPT, f"tenants {listing} refer to it")
            else:
                partner.delete()
                self.note("partner", partner.name, DELETED)

    def workload_classes(self) -> None:
        names = {w.name for w in self.config.workload_classes}
        for workload in WorkloadClass.objects.exclude(name__in=names).order_by("name"):
            users = App.objects.filter(default_workload=workload).select_related("team__tenant")
            if users.exists():
                listing = _listing(
                    f"{app.team.tenant.name}/{app.team.name}/{app.name}" for app in users
                )
                self.note("workload class", workload.name, KEPT, f"apps {listing} use it")
            else:
                workload.delete()
                self.note("workload class", workload.name, DELETED)


# The proxy's ledger and jobs live above this app (gateway/); it registers here what they refer
# to (gateway/apps.py), so that pruning keeps those rows' tenants, apps and keys.
HistoryCheck = Callable[..., bool]
HISTORY: list[HistoryCheck] = []


def history_register(check: HistoryCheck) -> HistoryCheck:
    """Count ``check(**ids)`` (tenant_id, team_id, app_id, api_key_id) as history too."""
    HISTORY.append(check)
    return check


def _history(**ids: int) -> bool:
    """Whether ledger rows (reservations here; generations, jobs registered) refer to these ids."""
    reservation_ids = {k: v for k, v in ids.items() if k != "team_id"}
    if reservation_ids and Reservation.objects.filter(**reservation_ids).exists():
        return True
    return any(check(**ids) for check in HISTORY)


def _key_label(key: ApiKey) -> str:
    return f"{key.app.team.tenant.name}/{key.app.team.name}/{key.app.name}/{key.name}"


def _listing(names: Iterable[str]) -> str:
    items = sorted(set(names))
    more = f", … {len(items) - _LISTED} more" if len(items) > _LISTED else ""
    return ", ".join(items[:_LISTED]) + more
