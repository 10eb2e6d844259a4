"""Who is calling (SPEC A3, C1): API key → a typed principal, from an in-memory index.

The index is part of the configuration snapshot (gateway/snapshot.py), so resolving a key costs
a dict lookup and a constant-time hash comparison — no database query per request.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from tenants.keys import KEY_TYPE_PREFIX, key_hash, key_matches, key_prefix
from tenants.models import ApiKey


@dataclass(frozen=True, slots=True)
class Principal:
    """Everything the broker and router need to know about a caller, as plain values."""

    key_id: int
    key_name: str
    key_prefix: str
    app_id: int
    app_name: str
    environment: str
    team_id: int
    team_name: str
    tenant_id: int
    tenant_name: str
    tenant_weight: float
    tenant_default_sort: str
    partner_id: int | None
    partner_name: str | None
    workload: str  # the app's default workload class ("" when none is set)
    allowed_models: frozenset[str] | None  # None: every model
    expires_at: float | None  # epoch seconds
    revoked: bool

    def may_use(self, model_slug: str) -> bool:
        return self.allowed_models is None or model_slug in self.allowed_models


@dataclass(frozen=True)
class KeyIndex:
    by_prefix: dict[str, tuple[tuple[str, Principal], ...]]
    by_id: dict[int, Principal] = field(default_factory=dict)

    def identify(self, secret: str, *, now: float) -> Principal | None:
        """The principal of a usable key, else None — unknown, revoked and expired look alike."""
        # Hash first, whatever the prefix says, so the timing does not reveal which prefixes exist.
        digest = key_hash(secret)
        found: Principal | None = None
        for stored_hash, principal in self.by_prefix.get(key_prefix(secret), ()):
            if key_matches(digest, stored_hash):
                found = principal
        return _usable(found, now)

    def principal_of(self, key_id: int, *, now: float) -> Principal | None:
        """The principal of a usable key by its id: a deferred job's caller, at run time."""
        return _usable(self.by_id.get(key_id), now)


def _usable(found: Principal | None, now: float) -> Principal | None:
    if found is None or found.revoked:
        return None
    if found.expires_at is not None and found.expires_at <= now:
        return None
    return found


def bearer_secret(authorization: str | None) -> str | None:
    """The secret of an ``Authorization: Bearer sk-sy-…`` header, if it looks like one."""
    if not authorization:
        return None
    scheme, _, secret = authorization.strip().partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret.startswith(KEY_TYPE_PREFIX):
        return None
    return secret


def api_key_secret(value: str | None) -> str | None:
    """The secret of an ``x-api-key: sk-sy-…`` header (Anthropic's clients), if it looks
    like one."""
    secret = (value or "").strip()
    return secret if secret.startswith(KEY_TYPE_PREFIX) else None


def key_index_build() -> KeyIndex:
    """Read every key with its hierarchy in one query (called when the config version changes)."""
    by_prefix: dict[str, list[tuple[str, Principal]]] = defaultdict(list)
    by_id: dict[int, Principal] = {}
    keys = ApiKey.objects.select_related(
        "app__team__tenant__partner", "app__default_workload"
    ).filter(app__team__tenant__is_active=True)
    for key in keys:
        app, team = key.app, key.app.team
        tenant = team.tenant
        principal = Principal(
            key_id=key.pk,
            key_name=key.name,
            key_prefix=key.prefix,
            app_id=app.pk,
            app_name=app.name,
            environment=app.environment,
            team_id=team.pk,
            team_name=team.name,
            tenant_id=tenant.pk,
            tenant_name=tenant.name,
            tenant_weight=tenant.weight,
            tenant_default_sort=tenant.default_sort,
            partner_id=tenant.partner_id,
            partner_name=tenant.partner.name if tenant.partner else None,
            workload=app.default_workload.name if app.default_workload else "",
            allowed_models=frozenset(key.allowed_models) if key.allowed_models else None,
            expires_at=key.expires_at.timestamp() if key.expires_at else None,
            revoked=key.revoked_at is not None,
        )
        by_prefix[key.prefix].append((key.secret_hash, principal))
        by_id[key.pk] = principal
        old_hash = key.previous_secret_hash
        # Skipped when a file set the old secret back as the current one (loadconfig).
        if old_hash and old_hash != key.secret_hash and key.previous_valid_until is not None:
            # A rotated key's old secret: the same caller, usable until its overlap ends (or
            # the key expires, if sooner); checked by identify's clock like any expiry.
            until = key.previous_valid_until.timestamp()
            if principal.expires_at is not None:
                until = min(until, principal.expires_at)
            by_prefix[key.previous_prefix].append((old_hash, replace(principal, expires_at=until)))
    return KeyIndex({prefix: tuple(entries) for prefix, entries in by_prefix.items()}, by_id)
