"""What both wire protocols share: header value formats, ids, generated content, parse errors."""

from __future__ import annotations

import base64
import functools
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from simulator.model import CompletionRequest, LimitStatus, Plan, generate_pieces
from simulator.model.limits import DimensionStatus

Headers = list[tuple[str, str]]
SIGNATURE_BYTES = 192  # a thinking block's signature: base64 of this many bytes
# What ``response_format: {"type": "json_object"}`` is answered with: some JSON object.
JSON_OBJECT_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
}


@dataclass
class Response:
    status: int
    headers: Headers
    body: bytes
    request_id: str | None = None  # when the body names one, the header must say the same
    content_type: str = "application/json"


class BadRequest(Exception):
    """A request the protocol refuses with 400 (or ``status``) before the model sees it."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


@dataclass
class Parsed:
    """A wire request reduced to what the simulator needs."""

    request: CompletionRequest
    stream: bool
    include_usage: bool = False
    # The end user the client named (OpenAI ``user``, Anthropic ``metadata.user_id``): what
    # ``GET /_calls`` counts calls by, so a test can tell how often one request reached us.
    caller: str | None = None


@dataclass
class Content:
    """The output of one plan: ``pieces[i]`` is token ``i`` (text, or a slice of the tool call's
    arguments or of a structured answer's JSON; a slice may be empty when the text is shorter
    than the token count). The first ``thinking`` pieces are the thinking, signed by
    ``signature``; the answer follows."""

    pieces: list[str]
    tool_call_id: str | None = None
    thinking: int = 0
    signature: str = ""

    @property
    def text(self) -> str:
        """The answer: prose, the tool call's arguments or the structured answer's JSON."""
        return "".join(self.pieces[self.thinking :])

    @property
    def thinking_text(self) -> str:
        return "".join(self.pieces[: self.thinking])


class WireStream(Protocol):
    """The SSE events of one plan in one protocol; ``tokens`` covers pieces ``start..end``."""

    def head(self) -> bytes: ...

    def first_token(self) -> bytes: ...

    def tokens(self, start: int, end: int, group: int) -> bytes: ...

    def tail(self) -> bytes: ...


def go_duration(seconds: float) -> str:
    """Go's ``time.Duration`` string at millisecond precision: ``120ms``, ``1s``, ``6m0s``."""
    ms = max(0, round(seconds * 1000))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest // 1000}" if rest % 1000 == 0 else f"{rest / 1000:.3f}".rstrip("0")
    text = f"{hours}h" if hours else ""
    if hours or minutes:
        text += f"{minutes}m"
    return f"{text}{secs}s"


def rfc3339(epoch_seconds: float) -> str:
    """An RFC 3339 UTC timestamp at whole seconds, rounded up (a reset is never early)."""
    return _rfc3339_second(math.ceil(epoch_seconds))


@functools.lru_cache(maxsize=1024)
def _rfc3339_second(second: int) -> str:
    return datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_id(rng: random.Random, prefix: str, length: int = 24) -> str:
    """``prefix`` + ``length`` random hex digits."""
    return prefix + f"{rng.getrandbits(4 * length):0{length}x}"


def make_content(plan: Plan, rng: random.Random, tool_id_prefix: str) -> Content:
    thinking: list[str] = []
    signature = ""
    if plan.thinking_tokens:
        thinking = generate_pieces(rng, plan.thinking_tokens)
        # Opaque to clients, who only send it back: random bytes of a real signature's length.
        signature = base64.b64encode(rng.randbytes(SIGNATURE_BYTES)).decode()
    answer_tokens = plan.output_tokens - plan.thinking_tokens
    call, tool_call_id = plan.tool_call, None
    if call is not None:
        pieces = _slices(call.arguments_json, answer_tokens)
        tool_call_id = make_id(rng, tool_id_prefix)
    elif plan.answer_json is not None:
        pieces = _slices(plan.answer_json, answer_tokens)
    else:
        pieces = generate_pieces(rng, answer_tokens)
    return Content(thinking + pieces, tool_call_id, len(thinking), signature)


def _slices(text: str, tokens: int) -> list[str]:
    """``text`` cut into ``tokens`` consecutive slices (at least one) of nearly equal length."""
    n = max(1, tokens)
    return [text[i * len(text) // n : (i + 1) * len(text) // n] for i in range(n)]


def requests_dimension(status: LimitStatus) -> DimensionStatus | None:
    """The request limit headers report: per minute, or the daily one once it is the tighter."""
    minute, day = status.get("requests"), status.get("requests_per_day")
    if day is not None and (minute is None or day.remaining < minute.remaining):
        return day
    return minute


def tokens_dimension(status: LimitStatus) -> DimensionStatus | None:
    """Input and output buckets together, as one ``tokens`` limit (sum of both, later reset)."""
    parts = [d for d in (status.get("input_tokens"), status.get("output_tokens")) if d is not None]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return DimensionStatus(
        "input_tokens",
        sum(d.limit for d in parts),
        sum(d.remaining for d in parts),
        max(d.reset_s for d in parts),
    )


def load_json_object(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRequest(
            "We could not parse the JSON body of your request. The request body must be valid JSON."
        ) from None
    if not isinstance(data, dict):
        raise BadRequest("The request body must be a JSON object.")
    return data


def optional_int(data: dict[str, Any], name: str, *, minimum: int = 1) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"Invalid '{name}': expected an integer >= {minimum}.", param=name)
    return value


def stop_list(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise BadRequest(f"Invalid '{name}': expected a string or an array of strings.", param=name)


def text_of(value: Any) -> str:
    """All text in a content value (string, list of parts/blocks, nested tool results)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(text_of(item) for item in value)
    if isinstance(value, dict):
        kind = value.get("type")
        if kind in ("image", "image_url", "input_audio"):
            return ""
        if isinstance(value.get("text"), str):
            return str(value["text"])
        if kind == "tool_use":
            return f"{value.get('name', '')} {orjson.dumps(value.get('input', {})).decode()}"
        if "content" in value:
            return text_of(value["content"])
    return ""


def count_images(value: Any) -> int:
    if isinstance(value, list):
        return sum(count_images(item) for item in value)
    if isinstance(value, dict):
        if value.get("type") in ("image", "image_url"):
            return 1
        return count_images(value.get("content"))
    return 0


def caller_of(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
