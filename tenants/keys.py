"""API key secrets (SPEC A2): a readable type prefix, a public lookup prefix, a stored hash.

Secrets are random and long, so a single SHA-256 is the right hash (as for Stripe or
healthchecks keys): a slow password hash would only add latency to every request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_TYPE_PREFIX = "sk-sy-"
# Characters of the secret kept in clear to find the key and to show it in the admin.
LOOKUP_PREFIX_LENGTH = 12


def key_generate() -> str:
    """A new secret, shown to its owner once."""
    return KEY_TYPE_PREFIX + secrets.token_urlsafe(32)


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def key_prefix(secret: str) -> str:
    return secret[:LOOKUP_PREFIX_LENGTH]


def key_matches(secret_hash: str, stored_hash: str) -> bool:
    return hmac.compare_digest(secret_hash, stored_hash)
