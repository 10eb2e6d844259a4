"""Stored responses of the Responses door (``store``): saved as the answer goes out, read by
``GET /v1/responses/{id}`` and by a later turn's ``previous_response_id``, deleted on request
or after ``RESPONSE_RETENTION_SECONDS``.

Every read and delete takes the caller's app: another app's response is the same 404 as one
that does not exist. The save is one INSERT, awaited before the answer (or the stream's
``response.completed``) goes out, so a client that sends the next turn at once finds it.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from common.db import database_work
from gateway.ledger import without_nul
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
    """Store an answer; False when the database refused (the answer still goes out: the
    provider made it and charged for it)."""
    try:
        await database_work(_save)(
            id=id,
            owner=owner,
            generation_id=generation_id,
            model=model,
            session=session,
            conversation=conversation,
            response=response,
        )
    except DatabaseError:
        log.warning("response %s could not be stored", id, exc_info=True)
        return False
    return True


def _save(
    *,
    id: str,
    owner: Principal,
    generation_id: str,
    model: str,
    session: str,
    conversation: list[JSON],
    response: JSON,
) -> None:
    # In the database's thread: the NUL walk of a long conversation stays off the event loop.
    StoredResponse.objects.create(
        id=id,
        tenant_id=owner.tenant_id,
        app_id=owner.app_id,
        api_key_id=owner.key_id,
        generation_id=generation_id,
        model=model[:200],
        session=session[:256],
        conversation=without_nul(conversation),
        response=without_nul(response),
    )


def response_find(*, app_id: int, id: str) -> StoredResponse | None:
    return StoredResponse.objects.filter(pk=id, app_id=app_id).first()


async def turn_find(*, app_id: int, id: str) -> StoredTurn | None:
    """The earlier turn a request continues (``previous_response_id``), if the app has it."""
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
    deleted, _ = StoredResponse.objects.filter(pk=id, app_id=app_id).delete()
    return bool(deleted)


def responses_forget(now: dt.datetime) -> int:
    """Delete stored responses older than ``RESPONSE_RETENTION_SECONDS``: they hold the
    caller's prompts and answers, which are not the platform's to hoard (the ledger keeps the
    usage)."""
    before = now - dt.timedelta(seconds=settings.RESPONSE_RETENTION_SECONDS)
    deleted, _ = StoredResponse.objects.filter(created_at__lt=before).delete()
    return deleted
