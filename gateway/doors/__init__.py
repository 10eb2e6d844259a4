"""The front doors: each protocol a client may speak, parsed into one canonical request
(``base``) and answered in its own protocol."""

from __future__ import annotations

from gateway.doors.base import Door
from gateway.doors.chat import CHAT
from gateway.doors.embeddings import EMBEDDINGS_DOOR
from gateway.doors.messages import MESSAGES_DOOR
from gateway.doors.responses import ResponsesDoor

# Every door by name (a deferred job names the door it came in by). The Responses door is made
# per request (its caller and earlier turn); this one, without them, runs deferred jobs.
DOORS: dict[str, Door] = {
    door.name: door for door in (CHAT, MESSAGES_DOOR, EMBEDDINGS_DOOR, ResponsesDoor())
}


def door_for(name: str) -> Door:
    return DOORS[name]
