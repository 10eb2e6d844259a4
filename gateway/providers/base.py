"""What every provider adapter speaks: the canonical request, usage, limits and outcomes.

The public API is OpenAI Chat Completions, so the canonical request and response *are* OpenAI
chat-completion dicts. An adapter translates them to and from its provider's wire protocol,
turns the provider's rate-limit headers into canonical observations, and classifies each
outcome (SPEC F1). Adapters do no I/O and never retry: the pipeline does the HTTP call, the
broker decides about retries.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

# The broker's vocabulary (quotas/core/observed.py), which every adapter produces.
from quotas.core.observed import LimitObservation as LimitObservation
from quotas.core.observed import RateLimitInfo as RateLimitInfo
from quotas.core.observed import Usage as Usage

JSON = dict[str, Any]


class Outcome(enum.Enum):
    """SPEC F1: what a provider answer means for retrying."""

    OK = "ok"
    CAPACITY = "capacity"  # temporary 429: retry after Retry-After
    OVERLOAD = "overload"  # 503 / 529: retry with backoff
    POLICY = "policy"  # 429 spend cap / exhausted quota, 403: never retry
    REQUEST_ERROR = "request_error"  # 400 / 404 / 413 / 422: the request itself is wrong
    AUTH = "auth"  # 401: our provider credential is wrong; not the caller's fault
    PROVIDER_ERROR = "provider_error"  # 500 and other provider faults: retryable

    @property
    def retryable(self) -> bool:
        return self in (Outcome.CAPACITY, Outcome.OVERLOAD, Outcome.PROVIDER_ERROR)


@dataclass(frozen=True)
class Classified:
    outcome: Outcome
    message: str
    provider_code: str = ""  # the provider's own error type/code, for logs and metadata


@dataclass(frozen=True)
class UpstreamRequest:
    path: str  # appended to the provider's base URL
    headers: dict[str, str]
    json: JSON


@dataclass
class Completion:
    """A whole (non-streaming) answer in canonical form."""

    body: JSON  # an OpenAI chat.completion object (embed: OpenAI's embeddings list)
    usage: Usage | None  # None when the provider reported none: keep the estimate, don't zero it
    finish_reason: str
    # The provider's own body, kept when it spoke the door's protocol (pass-through).
    native: JSON | None = None


@dataclass
class SSEEvent:
    event: str
    data: str


@dataclass
class SSEParser:
    """Incremental Server-Sent Events parser: feed bytes, get complete events."""

    _buffer: bytes = b""
    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, chunk: bytes) -> Iterator[SSEEvent]:
        # One split of what came (a read holds many events when the provider is fast), not a
        # copy of the rest of the buffer per line; the part after the last newline waits.
        *lines, self._buffer = (self._buffer + chunk).split(b"\n")
        for raw in lines:
            # "replace": a garbled byte must not kill a stream that is otherwise fine.
            line = raw.rstrip(b"\r").decode("utf-8", "replace")
            if line == "":
                if self._data:
                    yield SSEEvent(self._event or "message", "\n".join(self._data))
                self._event, self._data = "", []
            elif line.startswith(":"):
                continue
            else:
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "event":
                    self._event = value
                elif name == "data":
                    self._data.append(value)


class StreamTranslator(Protocol):
    """Turns one provider stream into OpenAI ``chat.completion.chunk`` dicts.

    When the provider reports usage, the last chunk is a usage chunk (``choices == []``,
    ``usage`` set), as OpenAI sends with ``stream_options.include_usage``: the pipeline forwards
    it only if the client asked. ``feed`` raises ``StreamError`` for an error event or a
    malformed event.
    """

    usage: Usage | None
    finish_reason: str

    def feed(self, event: SSEEvent) -> list[JSON]:
        """Chunks to send for this event (possibly none)."""
        ...

    @property
    def done(self) -> bool:
        """True once the provider signalled the end of the stream."""
        ...


class StreamError(Exception):
    """The provider reported an error inside a stream that had already started."""

    def __init__(self, classified: Classified) -> None:
        super().__init__(classified.message)
        self.classified = classified


class RequestNotSupported(Exception):
    """The canonical request uses something this provider's protocol cannot express.

    Raised by ``build_request`` before anything is sent; the endpoint cannot serve this request
    (try another candidate, or answer 400 when none is left).
    """


class Adapter(Protocol):
    protocol: str

    def build_request(
        self, body: JSON, *, upstream_model: str, api_key: str, stream: bool, max_output: int
    ) -> UpstreamRequest:
        """The wire request for a canonical body; ``max_output`` is used when the body has none."""
        ...

    def build_native_request(
        self,
        native: JSON,
        *,
        upstream_model: str,
        api_key: str,
        stream: bool,
        max_output: int,
        headers: Mapping[str, str],
    ) -> UpstreamRequest:
        """The wire request for a body already in this provider's protocol (a door of the same
        protocol): sent as it is but for the model, the stream flag and the credential."""
        ...

    def parse_completion(
        self, data: JSON, *, response_id: str, model: str, created: int | None = None
    ) -> Completion:
        """A provider's non-streaming answer as an OpenAI chat.completion.

        Raises ``StreamError`` when a 2xx body is an error envelope or is malformed.
        """
        ...

    def stream_translator(
        self, *, response_id: str, model: str, created: int
    ) -> StreamTranslator: ...

    def build_embeddings_request(
        self, body: JSON, *, upstream_model: str, api_key: str
    ) -> UpstreamRequest:
        """The wire request for an OpenAI embeddings body (the ``embed`` operation); raises
        ``RequestNotSupported`` when the protocol has no embeddings."""
        ...

    def parse_embeddings(self, data: JSON, *, model: str) -> Completion:
        """A provider's embeddings answer as OpenAI's embeddings ``list`` named ``model``, with
        input-only usage; raises ``StreamError`` when a 2xx body is an error or is malformed."""
        ...

    def rate_limits(self, headers: Mapping[str, str], *, now: float) -> RateLimitInfo:
        """Canonical observations from the provider's rate-limit headers (``now``: epoch s)."""
        ...

    def classify(self, status: int, headers: Mapping[str, str], body: bytes) -> Classified:
        """What a non-2xx answer means for retrying (SPEC F1); never raises."""
        ...
