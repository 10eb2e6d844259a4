"""Demand estimation (SPEC C2, C11): tokens and spend of a request before it is sent.

No tokenizer that works offline is installable for the providers' models (tiktoken downloads
its vocabularies at run time), so input tokens come from a calibrated heuristic — about four
characters of English or JSON per token, plus per-message and per-tool overheads as OpenAI
documents them — multiplied by a *bounded* correction factor learned from reconciliation.

Corrections are kept per estimation class: model, route (endpoint), prompt family (a hash of the
system prompt's start and the tool names), context-length band (powers of two) and
structured-output mode. Each observation moves the factor by at most ``MAX_STEP`` in log space
and the factor stays within ``[MIN_FACTOR, MAX_FACTOR]``, so one odd request cannot skew it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4.0
MESSAGE_OVERHEAD_TOKENS = 4  # role and separators, per message
REQUEST_OVERHEAD_TOKENS = 3  # the assistant reply primer
TOOL_OVERHEAD_TOKENS = 8  # per tool definition, besides its JSON
IMAGE_TOKENS = 765  # a high-detail 512 px tile pair; images are rare in this gateway's traffic

MIN_FACTOR, MAX_FACTOR = 0.5, 2.0
MAX_STEP = math.log(1.25)  # one observation moves a factor by at most 25 %
LEARNING_RATE = 0.1
MAX_CLASSES = 10_000  # corrections kept per process (least recently used dropped)


@dataclass(frozen=True, slots=True)
class EstimationClass:
    """What makes two requests' estimation errors alike (C11)."""

    model: str
    route: str
    prompt_family: str
    context_band: int
    structured_output: str  # none | json_object | json_schema | tools


@dataclass(frozen=True, slots=True)
class Demand:
    """What one request is expected to take from every bucket (before the endpoint is known,
    spend is computed per endpoint with ``spend``)."""

    input_tokens: int
    output_tokens: int  # reserved: the request's max, else the model's default estimate
    estimation: EstimationClass
    raw_input_tokens: int  # the heuristic before correction, for learning

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def spend(self, *, price_input: float, price_output: float) -> float:
        """USD at per-million prices; uncached input, so reconciliation can only refund."""
        return (self.input_tokens * price_input + self.output_tokens * price_output) / 1e6


def text_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def input_tokens_heuristic(body: Mapping[str, Any]) -> int:
    """Input tokens of a chat-completion body: messages, tool definitions, output schema."""
    total = REQUEST_OVERHEAD_TOKENS
    for message in body.get("messages") or ():
        total += MESSAGE_OVERHEAD_TOKENS + _message_tokens(message)
    for tool in body.get("tools") or ():
        total += TOOL_OVERHEAD_TOKENS + text_tokens(_compact(tool.get("function", tool)))
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and "json_schema" in response_format:
        total += text_tokens(_compact(response_format["json_schema"]))
    return total


def _message_tokens(message: Mapping[str, Any]) -> int:
    tokens = 0
    content = message.get("content")
    if isinstance(content, str):
        tokens += text_tokens(content)
    elif isinstance(content, Sequence):
        for part in content:
            if not isinstance(part, Mapping):
                continue
            if part.get("type") == "text":
                tokens += text_tokens(str(part.get("text", "")))
            else:
                tokens += IMAGE_TOKENS
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        tokens += text_tokens(str(function.get("name", ""))) + text_tokens(
            str(function.get("arguments", ""))
        )
    return tokens


def _compact(value: Any) -> str:
    # Key order and spacing as a provider would serialise it; exactness is the correction's job.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def requested_max_output(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_completion_tokens") or body.get("max_tokens")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def estimation_class(
    body: Mapping[str, Any], *, model: str, route: str, input_tokens: int
) -> EstimationClass:
    return EstimationClass(
        model=model,
        route=route,
        prompt_family=prompt_family(body),
        context_band=max(0, int(input_tokens).bit_length() - 1),
        structured_output=structured_output_mode(body),
    )


def prompt_family(body: Mapping[str, Any]) -> str:
    """Requests from one template share a system prompt start and a tool set."""
    system = ""
    for message in body.get("messages") or ():
        if message.get("role") in ("system", "developer") and isinstance(
            message.get("content"), str
        ):
            system = message["content"][:200]
            break
    tools = ",".join(
        sorted(str((t.get("function") or {}).get("name", "")) for t in body.get("tools") or ())
    )
    return hashlib.blake2b(f"{system}|{tools}".encode(), digest_size=6).hexdigest()


def structured_output_mode(body: Mapping[str, Any]) -> str:
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") in (
        "json_object",
        "json_schema",
    ):
        return str(response_format["type"])
    return "tools" if body.get("tools") else "none"


class Corrections:
    """Bounded, learned multipliers of the input estimate, one per estimation class."""

    def __init__(self, max_classes: int = MAX_CLASSES) -> None:
        self._log_factors: OrderedDict[EstimationClass, float] = OrderedDict()
        self._max = max_classes

    def input_factor(self, cls: EstimationClass) -> float:
        log_factor = self._log_factors.get(cls)
        return 1.0 if log_factor is None else math.exp(log_factor)

    def learn(self, cls: EstimationClass, *, raw_input: int, actual_input: int) -> None:
        """Move the class's factor toward ``actual / raw``, by a bounded step."""
        if raw_input <= 0 or actual_input <= 0:
            return
        target = math.log(actual_input / raw_input)
        current = self._log_factors.pop(cls, 0.0)
        step = max(-MAX_STEP, min(MAX_STEP, LEARNING_RATE * (target - current)))
        bounded = max(math.log(MIN_FACTOR), min(math.log(MAX_FACTOR), current + step))
        self._log_factors[cls] = bounded  # re-inserted last: most recently used
        if len(self._log_factors) > self._max:
            self._log_factors.popitem(last=False)


@dataclass(frozen=True, slots=True)
class RequestEstimate:
    """What the body alone says about a request's demand, read once when it is parsed.

    ``max_output`` is the request's own output limit (None: the model's default applies);
    0 means the request produces no output tokens (embeddings).
    """

    input_tokens: int  # the heuristic, before any correction
    max_output: int | None
    prompt_family: str
    structured_output: str

    def demand(
        self,
        *,
        model: str,
        route: str,
        default_output_tokens: int,
        max_output: int,
        corrections: Corrections,
    ) -> Demand:
        """The demand at one candidate: its corrected input; output = the request's max, else
        the model's default, within the endpoint's ``max_output``."""
        cls = EstimationClass(
            model=model,
            route=route,
            prompt_family=self.prompt_family,
            context_band=max(0, int(self.input_tokens).bit_length() - 1),
            structured_output=self.structured_output,
        )
        input_tokens = max(1, round(self.input_tokens * corrections.input_factor(cls)))
        output = self.max_output if self.max_output is not None else default_output_tokens
        return Demand(
            input_tokens=input_tokens,
            output_tokens=0 if output == 0 else max(1, min(output, max_output)),
            estimation=cls,
            raw_input_tokens=self.input_tokens,
        )


def request_estimate(body: Mapping[str, Any]) -> RequestEstimate:
    """The estimate of a chat-completion body (every door's common form)."""
    return RequestEstimate(
        input_tokens=input_tokens_heuristic(body),
        max_output=requested_max_output(body),
        prompt_family=prompt_family(body),
        structured_output=structured_output_mode(body),
    )
