"""An API key's life after it is issued (SPEC A2): it is rotated or revoked, never deleted, so
the ledger's rows keep naming a key that existed and a leaked secret can be cut off."""

from __future__ import annotations

from datetime import datetime, timedelta

from tenants.keys import key_generate, key_hash, key_prefix
from tenants.models import ApiKey


def key_rotate(key: ApiKey, *, now: datetime, overlap_seconds: float) -> str:
    """Give ``key`` a new secret and return it (to be shown once). The old secret keeps working
    for ``overlap_seconds`` (0: it stops at once); a secret an earlier rotation kept alive stops
    now, so at most two secrets of a key work at any time."""
    secret = key_generate()
    if overlap_seconds > 0:
        key.previous_secret_hash, key.previous_prefix = key.secret_hash, key.prefix
        key.previous_valid_until = now + timedelta(seconds=overlap_seconds)
    else:
        key.previous_secret_hash, key.previous_prefix, key.previous_valid_until = "", "", None
    key.secret_hash, key.prefix = key_hash(secret), key_prefix(secret)
    key.save(
        update_fields=[
            "secret_hash",
            "prefix",
            "previous_secret_hash",
            "previous_prefix",
            "previous_valid_until",
        ]
    )
    return secret


def key_revoke(key: ApiKey, *, now: datetime) -> None:
    """Stop every secret of ``key`` (the current one and any still in its rotation overlap)."""
    key.revoked_at = now
    key.previous_secret_hash, key.previous_prefix, key.previous_valid_until = "", "", None
    key.save(
        update_fields=[
            "revoked_at",
            "previous_secret_hash",
            "previous_prefix",
            "previous_valid_until",
        ]
    )
