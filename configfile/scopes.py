"""Every limit of the configuration file with the public name of its scope (``quotas.names``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from configfile.schema import Config
from quotas.limits import LimitSpec
from quotas.names import endpoint_scope_label, scope_name


def scoped_limits(config: Config) -> Iterator[tuple[str, LimitSpec]]:
    """Every limit of the file with its scope name, in file order.

    A scope whose name (or an enclosing one) was refused is skipped: the schema recorded that
    error and left the name as None, and the limits' names cannot be formed without it.
    """
    for provider in config.providers:
        yield from _limits(provider.limits, "provider", provider.name)
        for project in provider.projects:
            yield from _limits(project.limits, "project", provider.name, project.name)
        for credential in provider.keys:
            yield from _limits(credential.limits, "credential", provider.name, credential.name)
    for model in config.models:
        yield from _limits(model.limits, "model", model.slug)
        for endpoint in model.endpoints:
            if model.slug is not None and endpoint.provider is not None:
                label = endpoint_scope_label(model.slug, endpoint.provider)
                yield from _limits(endpoint.limits, "endpoint", label)
    for partner in config.partners:
        yield from _limits(partner.limits, "partner", partner.name)
    for tenant in config.tenants:
        yield from _limits(tenant.limits, "tenant", tenant.name)
        for team in tenant.teams:
            path = (tenant.name, team.name)
            yield from _limits(team.limits, "team", *path)
            for app in team.apps:
                yield from _limits(app.limits, "app", *path, app.name)
                for key in app.keys:
                    yield from _limits(key.limits, "api_key", *path, app.name, key.name)


def _limits(
    limits: Iterable[LimitSpec], kind: str, *names: str | None
) -> Iterator[tuple[str, LimitSpec]]:
    if any(name is None for name in names):
        return
    scope = scope_name(kind, *(name for name in names if name is not None))
    yield from ((scope, limit) for limit in limits)
