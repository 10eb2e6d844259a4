"""Writing a parsed configuration to the database: idempotent upsert by name, one transaction.

Objects the file does not mention are left alone, unless ``prune`` names the sections whose
unnamed objects are to be removed (``configfile.prune``). A second load of the same
file changes no row: values are compared before saving, key hashes are compared rather than
re-hashed, and a provider credential is re-encrypted only when the secret itself changed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import redis
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.utils import timezone

from common.redis import config_version_bump
from configfile import ConfigError, KnownNames, config_parse, config_read
from configfile.prune import SECTIONS, Removal, config_prune
from configfile.schema import Config, KeySpec, ProviderSpec, TenantSpec
from configfile.summary import CREATED, KINDS, UNCHANGED, UPDATED, Summary
from quotas.limits import LimitSpec
from quotas.models import Bucket, WorkloadClass
from quotas.names import bucket_name, endpoint_scope_label, scope_name
from routing import credentials
from routing.models import Credential, Endpoint, Model, Provider, ProviderProject
from tenants.keys import key_generate, key_hash, key_prefix
from tenants.models import ApiKey, App, Partner, Team, Tenant

M = TypeVar("M", bound=models.Model)
__all__ = ["KINDS", "Summary", "config_apply", "config_load", "known_names"]


class _DryRun(Exception):
    """Rolls the dry run's transaction back."""


def known_names(managed: frozenset[str] = frozenset()) -> KnownNames:
    """Names in the database the file may refer to without defining them; none of the
    ``managed`` sections, whose objects the file does not name are about to be pruned."""

    def names(section: str, model: type[models.Model], field: str) -> frozenset[str]:
        if section in managed:
            return frozenset()
        return frozenset(model._default_manager.values_list(field, flat=True))

    return KnownNames(
        providers=names("providers", Provider, "name"),
        models=names("models", Model, "slug"),
        workload_classes=names("workload_classes", WorkloadClass, "name"),
        partners=names("partners", Partner, "name"),
    )


def file_sections(data: object) -> frozenset[str]:
    """The top-level sections the file contains: the kinds of object it manages."""
    return frozenset(s for s in SECTIONS if isinstance(data, dict) and s in data)


def config_load(
    path: str | Path,
    *,
    env: Mapping[str, str] | None = None,
    dry_run: bool = False,
    prune: bool = False,
) -> Summary:
    """Validate and apply the file at ``path``; ``dry_run`` rolls everything back at the end;
    ``prune`` removes what the file's sections manage and it does not name.

    Raises ``ConfigError`` (and changes nothing) when the file is invalid.
    """
    data = config_read(path)
    sections = file_sections(data)
    config = config_parse(data, known=known_names(sections if prune else frozenset()))
    try:
        with transaction.atomic():
            summary = config_apply(
                config, env=os.environ if env is None else env, sections=sections, prune=prune
            )
            if dry_run:
                raise _DryRun
    except _DryRun:
        pass
    return summary


def config_apply(
    config: Config,
    *,
    env: Mapping[str, str],
    sections: frozenset[str] = frozenset(),
    prune: bool = False,
) -> Summary:
    """Upsert ``config`` in one transaction, then prune ``sections`` if ``prune`` (else only
    list what pruning would remove); bump the config version once on commit if it changed."""
    with transaction.atomic():
        writer = _Writer(env)
        writer.write(config)
        if writer.errors:
            raise ConfigError(writer.errors)
        summary = writer.summary
        for kind, model in KINDS.items():
            summary.left_alone[kind] = model.objects.count() - len(summary.outcomes.get(kind, {}))
        summary.pruned = prune
        if prune:
            summary.removals = config_prune(config, sections, now=timezone.now())
        elif sections:
            summary.removals = _prune_preview(config, sections)
        if summary.changed:
            transaction.on_commit(lambda: _announce(summary))
    return summary


def _prune_preview(config: Config, sections: frozenset[str]) -> list[Removal]:
    """What ``--prune`` would remove, found by pruning in a savepoint that is rolled back."""
    removals: list[Removal] = []
    try:
        with transaction.atomic():
            removals = config_prune(config, sections, now=timezone.now())
            raise _DryRun
    except _DryRun:
        pass
    return removals


def _announce(summary: Summary) -> None:
    """Tell the gateway processes to reload; the change itself is already committed."""
    try:
        config_version_bump()
    except redis.RedisError as error:
        summary.warnings.append(
            f"the configuration is saved, but the gateways were not told to reload: {error}"
        )


class _Writer:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.summary = Summary()
        self.errors: list[str] = []

    def write(self, config: Config) -> None:
        for spec in config.workload_classes:
            self.upsert(
                "workload class",
                spec.path,
                WorkloadClass,
                {"name": spec.name},
                {
                    "deadline_seconds": spec.deadline_seconds,
                    "max_queue_depth": spec.max_queue_depth,
                    "overload_action": spec.overload_action,
                    "weight": spec.weight,
                    "retry_budget": spec.retry_budget,
                    "stream_reservation": spec.stream_reservation,
                    "stream_step_tokens": spec.stream_step_tokens,
                    "fallback_contract": spec.fallback_contract,
                },
            )
        for spec in config.providers:
            values: dict[str, Any] = {
                "protocol": spec.protocol,
                "base_url": spec.base_url,
                "cache_ttl_seconds": spec.cache_ttl_seconds,
                "learn_concurrency": spec.learn_concurrency,
                "is_active": spec.is_active,
            }
            if spec.api_key_env:
                values.update(self.credential(spec.name, spec.api_key_env, spec.path))
            provider = self.upsert("provider", spec.path, Provider, {"name": spec.name}, values)
            self.buckets("provider", provider, scope_name("provider", spec.name), spec.limits)
            if provider is not None:
                self.write_pool(provider, spec)
        self.write_models(config)
        for spec in config.partners:
            partner = self.upsert("partner", spec.path, Partner, {"name": spec.name}, {})
            self.buckets("partner", partner, scope_name("partner", spec.name), spec.limits)
        for spec in config.tenants:
            self.write_tenant(spec)

    def write_pool(self, provider: Provider, spec: ProviderSpec) -> None:
        """B2: the organisation's projects and its key pool, each with its own limits."""
        projects: dict[str, ProviderProject | None] = {}
        for project_spec in spec.projects:
            projects[project_spec.name] = project = self.upsert(
                "provider project",
                project_spec.path,
                ProviderProject,
                {"provider": provider, "name": project_spec.name},
                {},
            )
            scope = scope_name("project", spec.name, project_spec.name)
            self.buckets("project", project, scope, project_spec.limits)
        for key_spec in spec.keys:
            values: dict[str, Any] = {
                "project": projects.get(key_spec.project),
                "is_active": key_spec.is_active,
            }
            existing = Credential.objects.filter(provider=provider, name=key_spec.name).first()
            current = existing.api_key_encrypted if existing is not None else ""
            values.update(
                self.secret(key_spec.api_key_env, current, key_spec.path, str(key_spec.name))
            )
            credential = self.upsert(
                "provider key",
                key_spec.path,
                Credential,
                {"provider": provider, "name": key_spec.name},
                values,
            )
            scope = scope_name("credential", spec.name, key_spec.name)
            self.buckets("credential", credential, scope, key_spec.limits)

    def secret(self, variable: str, current: str, path: str, what: str) -> dict[str, str]:
        """A pool key's encrypted secret to store, or nothing (keep the current one) when the
        variable is unset or holds the secret that is already stored."""
        secret = self.env.get(variable, "")
        if not secret:
            self.summary.warnings.append(
                f"{path}.api_key_env: {variable} is not set; key '{what}' keeps its current "
                "secret (none if it is new)"
            )
            return {}
        try:
            if current and credentials.decrypt(current) == secret:
                return {}
        except credentials.CredentialError:
            pass  # stored with an old key: replace it
        return {"api_key_encrypted": credentials.encrypt(secret)}

    def write_models(self, config: Config) -> None:
        by_slug: dict[str, Model | None] = {}
        for spec in config.models:
            by_slug[spec.slug] = model = self.upsert(
                "model",
                spec.path,
                Model,
                {"slug": spec.slug},
                {
                    "aliases": spec.aliases,
                    "default_output_tokens": spec.default_output_tokens,
                    "default_input_tokens": spec.default_input_tokens,
                    "max_cost_premium": spec.max_cost_premium,
                    "routing_parameters": spec.routing,
                    "allow_fallbacks": spec.allow_fallbacks,
                    "fallback_contract": spec.fallback_contract,
                    "is_active": spec.is_active,
                },
            )
            if model is None:
                continue
            for position, ep in enumerate(spec.endpoints):
                provider = Provider.objects.filter(name=ep.provider).first()
                if provider is None:
                    continue  # its provider failed to save: already reported
                endpoint = self.upsert(
                    "endpoint",
                    ep.path,
                    Endpoint,
                    {"model": model, "provider": provider},
                    {
                        "upstream_model": ep.upstream_model,
                        "position": position,
                        "price_input": ep.price.input,
                        "price_cached_input": ep.price.cached_input,
                        "price_output": ep.price.output,
                        "context_window": ep.context_window,
                        "max_output": ep.max_output,
                        "supports": ep.supports,
                        "region": ep.region,
                        "batch_api": ep.batch is not None,
                        "batch_discount": ep.batch.discount if ep.batch else Decimal("0.5"),
                        "batch_turnaround_seconds": round(ep.batch.turnaround)
                        if ep.batch
                        else 86_400,
                        "quality_flagged": ep.quality_flagged,
                        "is_active": ep.is_active,
                    },
                )
                label = endpoint_scope_label(spec.slug, ep.provider)
                self.buckets("endpoint", endpoint, scope_name("endpoint", label), ep.limits)
            self.buckets("model", model, scope_name("model", spec.slug), spec.limits)
        # Fallbacks may point forward in the file: set them once every model exists.
        for spec in config.models:
            model = by_slug[spec.slug]
            if model is not None:
                fallback = Model.objects.filter(slug=spec.fallback_model).first()
                self.upsert(
                    "model", spec.path, Model, {"pk": model.pk}, {"fallback_model": fallback}
                )

    def write_tenant(self, spec: TenantSpec) -> None:
        partner = Partner.objects.filter(name=spec.partner).first() if spec.partner else None
        tenant = self.upsert(
            "tenant",
            spec.path,
            Tenant,
            {"name": spec.name},
            {
                "partner": partner,
                "weight": spec.weight,
                "default_sort": spec.default_sort,
                "is_active": spec.is_active,
            },
        )
        if tenant is None:
            return
        self.buckets("tenant", tenant, scope_name("tenant", spec.name), spec.limits)
        for team_spec in spec.teams:
            team = self.upsert(
                "team", team_spec.path, Team, {"tenant": tenant, "name": team_spec.name}, {}
            )
            if team is None:
                continue
            path = (spec.name, team_spec.name)
            self.buckets("team", team, scope_name("team", *path), team_spec.limits)
            for app_spec in team_spec.apps:
                workload = WorkloadClass.objects.filter(name=app_spec.default_workload).first()
                app = self.upsert(
                    "app",
                    app_spec.path,
                    App,
                    {"team": team, "name": app_spec.name},
                    {
                        "environment": app_spec.environment,
                        "default_workload": workload,
                    },
                )
                if app is None:
                    continue
                app_path = (*path, app_spec.name)
                self.buckets("app", app, scope_name("app", *app_path), app_spec.limits)
                for key_spec in app_spec.keys:
                    key = self.write_key(app, key_spec)
                    scope = scope_name("api_key", *app_path, key_spec.name)
                    self.buckets("api_key", key, scope, key_spec.limits)

    def write_key(self, app: App, spec: KeySpec) -> ApiKey | None:
        values: dict[str, Any] = {
            "expires_at": spec.expires_at,
            "allowed_models": spec.allowed_models,
        }
        existing = ApiKey.objects.filter(app=app, name=spec.name).first()
        secret = spec.secret
        if not secret and existing is None:
            secret = key_generate()
            self.summary.secrets.append((spec.path, secret))
        if secret:
            digest = key_hash(secret)
            taken = ApiKey.objects.filter(secret_hash=digest)
            if existing is not None:
                taken = taken.exclude(pk=existing.pk)
            if taken.exists():
                self.errors.append(f"{spec.path}.secret: is already used by another key")
                return None
            values.update(secret_hash=digest, prefix=key_prefix(secret))
        return self.upsert("api key", spec.path, ApiKey, {"app": app, "name": spec.name}, values)

    def credential(self, provider: str, variable: str, path: str) -> dict[str, str]:
        """The encrypted credential to store, or nothing (keep the current one) when the
        environment variable is unset or holds the secret that is already stored."""
        secret = self.env.get(variable, "")
        if not secret:
            self.summary.warnings.append(
                f"{path}.api_key_env: {variable} is not set; provider '{provider}' keeps its "
                "current credential (none if it is new)"
            )
            return {}
        current = Provider.objects.filter(name=provider).values_list("api_key_encrypted", flat=True)
        token = current.first() or ""
        try:
            if token and credentials.decrypt(token) == secret:
                return {}
        except credentials.CredentialError:
            pass  # stored with an old key: replace it
        return {"api_key_encrypted": credentials.encrypt(secret)}

    def buckets(
        self, kind: str, owner: models.Model | None, scope: str, limits: list[LimitSpec]
    ) -> None:
        if owner is None:
            return
        for limit in limits:
            scopes: dict[str, Any] = {field: None for field in Bucket.SCOPE_FIELDS}
            scopes[kind] = owner
            self.upsert(
                "bucket",
                limit.path,
                Bucket,
                {"name": bucket_name(scope, limit)},
                {
                    "scope_kind": kind,
                    **scopes,
                    "dimension": limit.dimension,
                    "rule": limit.rule,
                    "capacity": limit.capacity,
                    "period_seconds": limit.period_seconds,
                    "window": limit.window,
                    "resets_at": limit.resets_at,
                    "timezone": limit.timezone,
                    "duration_seconds": limit.duration_seconds,
                    "factor": limit.factor,
                    "source": Bucket.Source.CONFIGURED,
                    "shadow": limit.shadow,
                },
            )

    def upsert(
        self, kind: str, path: str, model: type[M], lookup: dict[str, Any], values: dict[str, Any]
    ) -> M | None:
        """Create or update one row; record the outcome, or the error at ``path``."""
        obj = model._default_manager.filter(**lookup).first()
        outcome = CREATED if obj is None else UNCHANGED
        if obj is None:
            obj = model(**lookup)
        changed = [name for name, value in values.items() if not _same(obj, name, value)]
        for name in changed:
            setattr(obj, name, values[name])
        if outcome == UNCHANGED and changed:
            outcome = UPDATED
        if outcome != UNCHANGED:
            try:
                obj.full_clean()
            except ValidationError as error:
                self.errors.extend(f"{path}: {message}" for message in _messages(error))
                return None
            obj.save()
        self.summary.record(kind, obj.pk, outcome)
        return obj


def _same(obj: models.Model, name: str, value: Any) -> bool:
    current = getattr(obj, name)
    if isinstance(value, models.Model) or isinstance(current, models.Model):
        return getattr(current, "pk", None) == getattr(value, "pk", None)
    return bool(current == value)


def _messages(error: ValidationError) -> list[str]:
    if hasattr(error, "error_dict"):
        return [f"{name}: {'; '.join(msgs)}" for name, msgs in error.message_dict.items()]
    return list(error.messages)
