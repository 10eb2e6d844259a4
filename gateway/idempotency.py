"""E3: a request with an ``Idempotency-Key`` reaches a provider once, however often it is sent.

Keys belong to the caller's app (two apps of one tenant may both send "job-1"). The first
request claims its key in Redis; what a repeat gets depends on what the key holds:

- the delivered answer (same body): that answer again, with ``Idempotent-Replayed: true``;
- a delivered stream, or an answer over ``MAX_REPLAY_BYTES``: 409 naming the generation, whose
  record ``GET /v1/generation?id=…`` shows (a stream cannot be replayed);
- nothing yet, the first is still in flight: 409;
- another body under the same key: 422, whatever the state (IETF idempotency-key draft, Stripe).

A request that delivered no answer (any error, the client gone) gives its key back, so the retry
is served; a delivered answer is kept for ``IDEMPOTENCY_TTL_SECONDS``.
"""

from __future__ import annotations

import hashlib
from contextlib import suppress
from functools import cache
from pathlib import Path
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from common import redis as sy_redis
from gateway.call import Call
from gateway.errors import IdempotencyConflict, IdempotencyKeyReused, InvalidRequest

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
ORIGINAL_HEADER = "x-switchyard-original-request-id"  # on a 409: the request that holds the key
MAX_KEY_LENGTH = 255
# Larger answers are not stored: a repeat gets 409 naming the generation instead.
MAX_REPLAY_BYTES = 1024 * 1024
# Not replayed: they describe the original transfer, and Django sets its own.
_UNREPLAYED_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}
)

_LUA = Path(__file__).parent / "lua"


async def _run(name: str, key: str, *args: str | int | bytes) -> Any:
    """Run a script by its digest (EVALSHA; loaded again if Redis lost it), not its source."""
    client = sy_redis.async_client()
    return await _script(name)(keys=[key], args=args, client=client)


@cache
def _script(name: str) -> AsyncScript:
    return sy_redis.async_client().register_script((_LUA / f"idempotency_{name}.lua").read_text())


def request_key(request: HttpRequest) -> str:
    """The request's Idempotency-Key ("" when absent), or InvalidRequest when it is malformed."""
    value: str = request.headers.get(HEADER.lower(), "")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidRequest(
            f"The Idempotency-Key header is {len(value)} characters long; "
            f"the limit is {MAX_KEY_LENGTH}.",
            param=HEADER,
        )
    if not all(" " <= char <= "~" for char in value):
        raise InvalidRequest(
            "The Idempotency-Key header may contain only printable ASCII characters "
            "(a UUID is a good key).",
            param=HEADER,
        )
    return value


def body_digest(raw: bytes) -> str:
    """The fingerprint of a request body that a repeat under the same key must match."""
    return hashlib.sha256(raw).hexdigest()


async def claim(call: Call, body_digest: str) -> HttpResponse | None:
    """Claim the call's key (None), or return the replay of its delivered answer.

    Raises IdempotencyKeyReused (another body), or IdempotencyConflict (still in flight, or
    an answer that cannot be replayed).
    """
    if not call.idempotency_key:
        return None
    reply = await _run("claim", _key(call), call.id, body_digest, settings.IDEMPOTENCY_TTL_SECONDS)
    if int(reply[0]) == 1:
        return None
    owner, digest, state, status, headers = (_text(value) for value in reply[1:6])
    content: bytes | None = reply[6]
    if digest != body_digest:
        raise IdempotencyKeyReused(
            f"This Idempotency-Key was already used by {owner} with a different request body. "
            "Send a new key for a new request, or the same body to get the first answer again.",
            param=HEADER,
            headers={ORIGINAL_HEADER: owner},
        )
    if state == "answered":
        return _replay(int(status), content or b"", headers)
    if state in ("streamed", "large"):
        what = "was streamed" if state == "streamed" else "is too large to be stored"
        raise IdempotencyConflict(
            f"A request with this Idempotency-Key was already answered as {owner}; its answer "
            f"{what}, so it cannot be replayed. Its record: GET /v1/generation?id={owner}",
            param=HEADER,
            headers={ORIGINAL_HEADER: owner},
        )
    raise IdempotencyConflict(
        f"A request with this Idempotency-Key is still in progress as {owner}. Retry after it "
        "finishes to get its answer; it is not sent again.",
        param=HEADER,
        headers={ORIGINAL_HEADER: owner},
    )


async def remember(call: Call, status: int, content: bytes, headers: dict[str, str]) -> None:
    """The call delivered this answer: a repeat of its key gets it back (a stream: 409)."""
    if not call.idempotency_key:
        return
    if call.stream:
        state, content, headers = "streamed", b"", {}
    elif len(content) > MAX_REPLAY_BYTES:
        state, content, headers = "large", b"", {}
    else:
        state = "answered"
    kept = {k: v for k, v in headers.items() if k.lower() not in _UNREPLAYED_HEADERS}
    # A failure here leaves the claim pending: repeats meet 409 until its TTL, never a resend.
    with suppress(RedisError):
        await _run(
            "remember",
            _key(call),
            call.id,
            state,
            status,
            orjson.dumps(kept),
            content,
            settings.IDEMPOTENCY_TTL_SECONDS,
        )


async def release(call: Call) -> None:
    """The call delivered no answer: give its key back so a retry is served (never after
    ``remember``, never another request's claim)."""
    if not call.idempotency_key or call.principal is None:
        return
    with suppress(RedisError):  # a claim that cannot be given back now expires with its TTL
        await _run("release", _key(call), call.id)


def _replay(status: int, content: bytes, headers_json: str) -> HttpResponse:
    response = HttpResponse(content, status=status, content_type="application/json")
    for name, value in (orjson.loads(headers_json) if headers_json else {}).items():
        response[name] = value
    response[REPLAYED_HEADER] = "true"
    return response


def _key(call: Call) -> str:
    assert call.principal is not None
    digest = hashlib.sha256(call.idempotency_key.encode()).hexdigest()
    return sy_redis.key("idempotency", "app", call.principal.app_id, digest)


def _text(value: bytes | None) -> str:
    return value.decode() if value is not None else ""
