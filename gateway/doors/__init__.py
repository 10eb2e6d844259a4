"""The front doors: each protocol a client may speak, parsed into one canonical request
(``base``) and answered in its own protocol."""

from __future__ import annotations

from gateway.doors.base import Door
from gateway.doors.chat import CHAT
from gateway.doors.responses import ResponsesDoor

# Every door by name (a deferred job names the door it came in by).
DOORS: dict[str, Door] = {CHAT.name: CHAT, ResponsesDoor.name: ResponsesDoor()}


def door_for(name: str) -> Door:
    return DOORS[name]
