"""A completion request in protocol-neutral form, as the behaviour model sees it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: its name, description and JSON schema of the arguments."""

    name: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class CompletionRequest:
    """What :meth:`ProviderBehaviour.admit` needs to know about one request.

    ``input_tokens`` is the prompt size in the simulator's native tokens (see
    :func:`simulator.model.tokenizer.count_prompt_tokens`); a discrete-event simulation may pass
    any number. ``tool_choice`` is ``"auto"``, ``"none"``, ``"required"`` or a tool name.
    ``cache_control`` says the request asked for prompt caching (Anthropic ``cache_control``);
    it only decides whether a cache miss reports ``cache_creation_input_tokens``.
    ``follows_tool_result`` says the last message is a tool's result: under ``"auto"`` the
    simulated model then answers in text, as real models mostly do, so a tool round trip ends.
    ``conversation`` names the conversation the request continues: a behaviour built with a
    ``prompt_cache_ttl_s`` then serves a cache hit only if that conversation's prefix is warm
    there. ``output_tokens`` is the natural length of a text answer when the caller draws it
    (the switchback experiment's traffic model); None draws it from the model's distribution.
    ``response_schema`` is the JSON schema a text answer must be valid against (OpenAI
    ``response_format``, Anthropic ``output_format``); None: the answer is prose.
    ``thinking_budget`` asks for extended thinking (Anthropic ``thinking``) of at most that many
    tokens before the answer, counted in the output; None: no thinking.
    ``embedding`` says it asks for vectors, not text: no output tokens are reserved or produced,
    and the answer takes the model's TTFT.
    """

    model: str
    input_tokens: int
    max_tokens: int | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"
    stop_sequences: tuple[str, ...] = ()
    cache_control: bool = False
    follows_tool_result: bool = False
    conversation: str | None = None
    output_tokens: int | None = None
    response_schema: Mapping[str, Any] | None = None
    thinking_budget: int | None = None
    embedding: bool = False
