"""DRF authentication by API key (SPEC A3, STYLE item 2): ``Authorization: Bearer sk-sy-…``
(or ``x-api-key: sk-sy-…``, as Anthropic's clients send it, e.g. for ``/v1/models``) attaches the
caller's typed ``Principal`` as ``request.auth``, or the answer is 401.

Keys are resolved from the configuration snapshot's in-memory ``KeyIndex``, never by a database
query per request. Where that index comes from depends on how the view is served:

- Under the ASGI server (production), Django runs a sync DRF view in a worker thread of the
  server's event loop. ``async_to_sync`` runs ``holder.get()`` back on that loop, so the view
  shares the proxy's snapshot and its background refresh: one copy, one refresher.
- With no event loop (Django's test client, a WSGI server) there is no proxy snapshot to share,
  and the holder's loop-bound parts (the async Redis client, its refresh task) must not be started
  on a throwaway loop. The process then keeps its own index, rebuilt when the configuration
  version in Redis moves: one Redis GET per call, a database read only after a change.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import ClassVar

from asgiref.sync import async_to_sync
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from common import redis as sy_redis
from gateway.errors import ServiceUnavailable
from gateway.snapshot import holder
from tenants.identity import KeyIndex, Principal, api_key_secret, bearer_secret, key_index_build


@dataclass(frozen=True)
class ApiKeyUser:
    """``request.user`` of an API-key request (DRF wants a user); ``request.auth`` is the key."""

    principal: Principal
    is_authenticated: ClassVar[bool] = True
    is_anonymous: ClassVar[bool] = False
    is_active: ClassVar[bool] = True

    def __str__(self) -> str:
        return f"api key {self.principal.key_prefix}…"


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[ApiKeyUser, Principal] | None:
        header = request.META.get("HTTP_AUTHORIZATION")
        api_key = request.META.get("HTTP_X_API_KEY")
        if not header and not api_key:
            return None  # DRF then answers 401 through the permission check
        secret = bearer_secret(header) if header else api_key_secret(api_key)
        principal = None
        if secret is not None:
            principal = key_index_for(request._request).identify(secret, now=time.time())
        if principal is None:
            raise exceptions.AuthenticationFailed("Invalid API key.")
        return ApiKeyUser(principal), principal

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) when the key is missing or wrong.
        return 'Bearer realm="switchyard"'


def principal_of(request: Request) -> Principal:
    """The authenticated caller of a view that requires an API key."""
    principal = request.auth
    assert isinstance(principal, Principal)
    return principal


def key_index_for(request: HttpRequest) -> KeyIndex:
    """The process's key index, for sync code serving ``request`` (see the module doc)."""
    try:
        if isinstance(request, ASGIRequest):
            return async_to_sync(holder.get)().keys
        return _local_index.get()
    except Exception as exc:  # Redis or the database is down: say so, as the proxy does
        raise ServiceUnavailable("Switchyard cannot read its configuration right now.") from exc


class _VersionedKeyIndex:
    """The key index of a process without an event loop, rebuilt when the config version moves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._built: tuple[str, int, KeyIndex] | None = None

    def get(self) -> KeyIndex:
        name = sy_redis.key("config", "version")
        version = int(sy_redis.sync_client().get(name) or 0)
        built = self._built
        if built is None or built[:2] != (name, version):
            with self._lock:
                built = self._built
                if built is None or built[:2] != (name, version):
                    built = (name, version, key_index_build())
                    self._built = built
        return built[2]


_local_index = _VersionedKeyIndex()
