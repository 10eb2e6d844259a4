"""Stored responses of the Responses door (``store``): saved as the answer goes out, read by
``GET /v1/responses/{id}`` and by a later turn's ``previous_response_id``, deleted on request
or after ``RESPONSE_RETENTION_SECONDS``.

Every read and delete takes the caller's app: another app's response is the same 404 as one
that does not exist.

The save stays off the database on the hot path: one Redis SET keeps the response readable at
once (for ``RESPONSE_HOT_SECONDS``, far longer than the ledger takes to store it), and the
PostgreSQL row goes the ledger's way (``gateway/ledger.py``: batched, off the request, by a
Celery task). Reads look in Redis first, then in PostgreSQL. A delete marks the id deleted for
as long as a queued row could still arrive, and the ledger drops a row so marked. With Redis
away the save is one INSERT, awaited, as before the ledger took it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings
from django.db import DatabaseError
from redis.exceptions import RedisError

from common import redis as sy_redis
from common.db import database_work
from gateway import ledger
from gateway.ledger import ledger_record_later, without_nul
from gateway.models import StoredResponse
from tenants.identity import Principal

log = logging.getLogger(__name__)

JSON = dict[str, Any]


@dataclass(frozen=True)
class StoredTurn:
    """What a later turn needs of an earlier one: its conversation and its session."""

    id: str
    conversation: list[JSON]
    session: str


async def response_save(
    *,
    id: str,
    owner: Principal,
    generation_id: str,
    model: str,
    session: str,
    conversation: list[JSON],
    response: JSON,
) -> bool:
    """Store an answer; False when neither Redis nor the database took it (the answer still
    goes out: the provider made it and charged for it)."""
    record = {
        "id": id,
        "created_at": time.time(),
        "tenant_id": owner.tenant_id,
        "app_id": owner.app_id,
        "api_key_id": owner.key_id,
        "generation_id": generation_id,
        "model": model[:200],
        "session": session[:256],
        "conversation": conversation,
        "response": response,
    }
    try:
        await sy_redis.async_client().set(_hot_key(id), orjson.dumps(record), ex=_hot_seconds())
    except RedisError:
        return await _save_now(record)
    ledger_record_later("response", record)
    return True


async def _save_now(record: JSON) -> bool:
    try:
        await database_work(_save)(record)
    except DatabaseError:
        log.warning("response %s could not be stored", record["id"], exc_info=True)
        return False
    return True


def _save(record: JSON) -> None:
    # In the database's thread: the NUL walk of a long conversation stays off the event loop.
    values = {**record, "created_at": dt.datetime.fromtimestamp(record["created_at"], tz=dt.UTC)}
    StoredResponse.objects.create(**without_nul(values))


def response_find(*, app_id: int, id: str) -> JSON | None:
    """The stored Response object, as the client got it."""
    hot = _hot_get(id, app_id)
    if hot is not None:
        return dict(hot["response"])
    found = StoredResponse.objects.filter(pk=id, app_id=app_id).values_list("response").first()
    return found[0] if found else None


async def turn_find(*, app_id: int, id: str) -> StoredTurn | None:
    """The earlier turn a request continues (``previous_response_id``), if the app has it."""
    try:
        raw = await sy_redis.async_client().get(_hot_key(id))
    except RedisError:
        raw = None
    hot = _owned(raw, app_id)
    if hot is not None:
        return StoredTurn(id=id, conversation=hot["conversation"], session=hot["session"])
    row = await database_work(
        lambda: (
            StoredResponse.objects.filter(pk=id, app_id=app_id)
            .values_list("conversation", "session")
            .first()
        )
    )()
    if row is None:
        return None
    conversation, session = row
    return StoredTurn(id=id, conversation=conversation, session=session)


def response_delete(*, app_id: int, id: str) -> bool:
    hot = _hot_get(id, app_id) is not None
    if hot:
        client = sy_redis.sync_client()
        # A row the ledger has not stored yet must not come back after this delete.
        client.set(ledger.response_deleted_key(id), b"1", ex=ledger.RESPONSE_DELETED_SECONDS)
        client.delete(_hot_key(id))
    deleted, _ = StoredResponse.objects.filter(pk=id, app_id=app_id).delete()
    return hot or bool(deleted)


def _hot_key(id: str) -> str:
    return sy_redis.key("response", id)


def _hot_seconds() -> int:
    return max(1, int(min(settings.RESPONSE_HOT_SECONDS, settings.RESPONSE_RETENTION_SECONDS)))


def _hot_get(id: str, app_id: int) -> JSON | None:
    try:
        raw = sy_redis.sync_client().get(_hot_key(id))
    except RedisError:
        return None
    return _owned(raw, app_id)


def _owned(raw: bytes | None, app_id: int) -> JSON | None:
    if raw is None:
        return None
    record: JSON = orjson.loads(raw)
    return record if record.get("app_id") == app_id else None


def responses_forget(now: dt.datetime) -> int:
    """Delete stored responses older than ``RESPONSE_RETENTION_SECONDS``: they hold the
    caller's prompts and answers, which are not the platform's to hoard (the ledger keeps the
    usage)."""
    before = now - dt.timedelta(seconds=settings.RESPONSE_RETENTION_SECONDS)
    deleted, _ = StoredResponse.objects.filter(created_at__lt=before).delete()
    return deleted
