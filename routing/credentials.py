"""Provider credentials at rest: Fernet, with a key derived from SECRET_KEY.

Set CREDENTIALS_KEY to a Fernet key to decouple credential encryption from SECRET_KEY rotation.
"""

from __future__ import annotations

import base64
import hashlib
import os

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


class CredentialError(Exception):
    pass


def _fernet() -> Fernet:
    explicit = os.environ.get("CREDENTIALS_KEY")
    if explicit:
        return Fernet(explicit.encode())
    digest = hashlib.sha256(f"switchyard-credentials:{settings.SECRET_KEY}".encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def encrypt(secret: str) -> str:
    return _fernet().encrypt(secret.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise CredentialError(
            "a provider credential cannot be decrypted: SECRET_KEY or CREDENTIALS_KEY changed"
        ) from None
