"""Checks across the whole file: unique names, references between sections and the database."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from common.reader import Errors
from configfile.schema import Config
from configfile.scopes import scoped_limits
from quotas.names import bucket_name
from tenants.keys import key_hash

BUCKET_NAME_MAX_LENGTH = 200
# How many known names an "unknown reference" error lists.
_LISTED = 20


@dataclass(frozen=True)
class KnownNames:
    """Names that already exist in the database, so the file may refer to them."""

    providers: frozenset[str] = field(default_factory=frozenset)
    models: frozenset[str] = field(default_factory=frozenset)
    workload_classes: frozenset[str] = field(default_factory=frozenset)
    partners: frozenset[str] = field(default_factory=frozenset)


def config_validate(config: Config, known: KnownNames, errors: Errors) -> None:
    """Record duplicate names and dangling references of ``config`` in ``errors``."""
    _unique(errors, "provider", ((p.path, p.name) for p in config.providers))
    _unique(errors, "model", ((m.path, m.slug) for m in config.models), key="slug")
    _model_names_unique(errors, config)
    _unique(errors, "workload class", ((w.path, w.name) for w in config.workload_classes))
    _unique(errors, "partner", ((p.path, p.name) for p in config.partners))
    _unique(errors, "tenant", ((t.path, t.name) for t in config.tenants))

    for provider in config.providers:
        _unique(errors, "project", ((p.path, p.name) for p in provider.projects))
        _unique(errors, "key", ((k.path, k.name) for k in provider.keys))
        _unique(
            errors,
            "key variable",
            ((k.path, k.api_key_env) for k in provider.keys),
            key="api_key_env",
        )
        projects = {p.name for p in provider.projects}
        for credential in provider.keys:
            if credential.project:
                _exists(
                    errors, f"{credential.path}.project", "project", credential.project, projects
                )

    providers = known.providers | {p.name for p in config.providers}
    models = known.models | {m.slug for m in config.models}
    workloads = known.workload_classes | {w.name for w in config.workload_classes}
    partners = known.partners | {p.name for p in config.partners}

    for workload in config.workload_classes:
        _contract_providers(errors, workload.path, workload.fallback_contract, providers)
    for model in config.models:
        _unique(
            errors,
            "endpoint provider",
            ((e.path, e.provider) for e in model.endpoints),
            key="provider",
        )
        for endpoint in model.endpoints:
            _exists(errors, f"{endpoint.path}.provider", "provider", endpoint.provider, providers)
        if model.fallback_model:
            _exists(errors, f"{model.path}.fallback_model", "model", model.fallback_model, models)
            if model.fallback_model == model.slug:
                errors.add(f"{model.path}.fallback_model", "must name another model")
        _contract_providers(errors, model.path, model.fallback_contract, providers)

    secrets: dict[str, str] = {}
    for tenant in config.tenants:
        if tenant.partner:
            _exists(errors, f"{tenant.path}.partner", "partner", tenant.partner, partners)
        _unique(errors, "team", ((t.path, t.name) for t in tenant.teams))
        for team in tenant.teams:
            _unique(errors, "app", ((a.path, a.name) for a in team.apps))
            for app in team.apps:
                if app.default_workload:
                    _exists(
                        errors,
                        f"{app.path}.default_workload",
                        "workload class",
                        app.default_workload,
                        workloads,
                    )
                _unique(errors, "key", ((k.path, k.name) for k in app.keys))
                for key in app.keys:
                    for i, slug in enumerate(key.allowed_models or []):
                        _exists(errors, f"{key.path}.allowed_models[{i}]", "model", slug, models)
                    if key.secret:
                        digest = key_hash(key.secret)
                        if digest in secrets:
                            errors.add(
                                f"{key.path}.secret", f"is the same as {secrets[digest]}.secret"
                            )
                        secrets.setdefault(digest, key.path)

    bucket_paths: dict[str, str] = {}
    for scope, limit in scoped_limits(config):
        if limit.rule == "" or limit.dimension is None:
            continue  # already reported
        name = bucket_name(scope, limit)
        if len(name) > BUCKET_NAME_MAX_LENGTH:
            errors.add(limit.path, f"bucket name '{name}' is longer than {BUCKET_NAME_MAX_LENGTH}")
        if name in bucket_paths:
            errors.add(
                limit.path,
                f"bucket name '{name}' is also used by {bucket_paths[name]} "
                "(give one of them a distinct 'name')",
            )
        bucket_paths.setdefault(name, limit.path)


def _model_names_unique(errors: Errors, config: Config) -> None:
    """A model id a client sends names one model: no alias repeats a slug or another alias."""
    owners = {m.slug: m.path for m in config.models if m.slug is not None}
    for model in config.models:
        for i, alias in enumerate(model.aliases or ()):
            if alias in owners:
                errors.add(
                    f"{model.path}.aliases[{i}]",
                    f"'{alias}' is already a name of {owners[alias]}",
                )
            else:
                owners[alias] = model.path


def _unique(errors: Errors, what: str, items: Iterable[tuple[str, str]], key: str = "name") -> None:
    seen: dict[str, str] = {}
    for path, name in items:
        if name is None:
            continue
        if name in seen:
            errors.add(f"{path}.{key}", f"duplicate {what} '{name}' (also {seen[name]})")
        seen.setdefault(name, path)


def _contract_providers(
    errors: Errors, path: str, contract: object, providers: Iterable[str]
) -> None:
    """F5: a misspelt provider in a contract would silently stop every fallback to it."""
    listed = contract.get("providers") if isinstance(contract, dict) else None
    if isinstance(listed, list):
        for n, name in enumerate(listed):
            _exists(errors, f"{path}.fallback_contract.providers[{n}]", "provider", name, providers)


def _exists(errors: Errors, path: str, what: str, name: str, known: Iterable[str]) -> None:
    names = sorted(n for n in known if n is not None)
    if name is not None and name not in names:
        listing = ", ".join(names[:_LISTED]) if names else "none"
        if len(names) > _LISTED:
            listing += f", … {len(names) - _LISTED} more"
        errors.add(path, f"unknown {what} '{name}' (known: {listing})")
