"""What every front door speaks to the spine (SPEC C1–C7, H1): the canonical request, and how
a door renders the spine's answer, stream and refusals back in its own protocol.

A door (``chat``, ``messages``, ``responses``, ``embeddings``) parses its protocol once into a
``CanonicalRequest``. The spine — identify → estimate → plan → admit → dispatch → reconcile →
decide — is the same function for every door (``gateway/pipeline.py``); it reads only the
canonical request. The back doors (``gateway/providers``) translate its ``body`` to each
provider's protocol, except when the provider speaks the door's own protocol: then the door's
``native`` body goes out with its protocol-specific fields intact (Anthropic ``cache_control``,
``thinking``, betas), and the provider's own answer comes back the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.http import HttpResponse

from gateway.errors import GatewayError
from gateway.providers.base import Completion, SSEEvent, Usage
from quotas.core.estimate import RequestEstimate
from routing.core.overrides import ProviderPreferences

JSON = dict[str, Any]


@dataclass(frozen=True)
class CanonicalRequest:
    """One request as every step of the spine sees it, whichever door it came in by.

    ``body`` is the request in the common form every adapter translates: an OpenAI
    chat-completions body (messages whose content is a string or typed parts — text, image;
    assistant ``tool_calls``, ``tool`` results — ``tools``, ``tool_choice``, output limits,
    sampling, ``response_format``). ``native`` is the door's own body when its protocol is a
    provider protocol (``door.protocol``), sent as it is to an endpoint speaking it.
    """

    door: Door
    body: JSON
    model: str  # as the client named it (an alias, a ``:nitro`` suffix …)
    estimate: RequestEstimate  # C2: made once, here; each candidate applies its corrections
    models: tuple[str, ...] = ()  # fallback models the client listed (G13)
    native: JSON | None = None
    stream: bool = False
    include_usage: bool = False  # a chat stream's usage chunk, when the client asked for it
    session_id: str | None = None  # G12: what ties a conversation's turns together
    user: str | None = None
    preferences: ProviderPreferences = field(default_factory=ProviderPreferences)
    features: frozenset[str] = frozenset()  # capabilities an endpoint needs (``supports``)
    headers: Mapping[str, str] = field(default_factory=dict)  # the door's headers to pass on
    # What the adapters are asked to do: "generate" (messages in, tokens out) or "embed".
    operation: str = "generate"

    def with_model(self, model: str) -> CanonicalRequest:
        """The same request for another model (E2's degradation), with no fallbacks of its own."""
        from dataclasses import replace

        body = {**self.body, "model": model, "models": []}
        native = {**self.native, "model": model} if self.native is not None else None
        return replace(self, body=body, native=native, model=model, models=())


@dataclass(frozen=True)
class Rendering:
    """What a door needs to render an answer: who made it, under which id and name."""

    call_id: str
    model: str  # the model's name as the client asked for it
    created: int
    provider: str
    cost: Callable[[Usage], float]
    # The provider spoke the door's protocol: its events and body go to the client as they are.
    passthrough: bool = False


class StreamRenderer(Protocol):
    """Turns one relayed stream into the door's server-sent events.

    ``feed`` gets each provider event with the OpenAI chunks translated from it (the relay
    measures TTFT and reassembles tool calls from the chunks); a pass-through door may send
    the provider's event as it is. ``close`` ends a complete stream, ``fail`` a broken one.
    """

    def feed(self, event: SSEEvent, chunks: list[JSON]) -> bytes: ...

    async def close(self, usage: Usage | None, finish_reason: str) -> bytes: ...

    def fail(self, error: GatewayError) -> bytes: ...


class Door(Protocol):
    @property
    def name(self) -> str:
        """ "chat" | "messages" | "responses" | "embeddings": the metrics label, api_type."""
        ...

    @property
    def protocol(self) -> str | None:
        """The provider protocol it speaks natively, for pass-through."""
        ...

    def parse(self, raw: bytes, headers: Mapping[str, str]) -> CanonicalRequest:
        """Validate a body (bytes as received) and build the canonical request; raises
        ``InvalidRequest`` / ``BodyTooLarge`` naming the offending field."""
        ...

    async def answer(
        self, request: CanonicalRequest, completion: Completion, usage: Usage, how: Rendering
    ) -> JSON:
        """The whole answer's body in the door's protocol (``completion.native`` is the
        provider's own body when it spoke the door's protocol)."""
        ...

    def stream_renderer(self, request: CanonicalRequest, how: Rendering) -> StreamRenderer: ...

    def error_response(self, error: GatewayError, headers: Mapping[str, str]) -> HttpResponse:
        """A refusal or failure in the door's envelope and status codes (H1)."""
        ...
