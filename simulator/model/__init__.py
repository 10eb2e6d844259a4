"""The provider-market behaviour model: pure Python, clock and randomness passed in.

No Django, no asyncio, no I/O, no wall clock. The live HTTP simulator (``simulator.server``)
and the discrete-event switchback experiment drive the same code; ``now`` is seconds on
whatever clock the driver uses (epoch seconds live, simulated seconds in an experiment), and
calls to one behaviour must come in non-decreasing ``now`` (a bucket ignores time going back).

Market file
    ``parse_market_text(yaml_text) -> Market`` / ``parse_market(decoded_tree) -> Market``;
    bad input raises ``MarketError`` (a ValueError) whose ``.path`` names the field, e.g.
    ``providers[0].models.chat-large.ttft_ms.p95``. ``parse_duration("40m") -> 2400.0``.
    ``Market.providers: tuple[ProviderSpec]``, ``Market.traffic: TrafficSpec | None``,
    ``Market.experiment: ExperimentSpec | None``. Model fields the example leaves out default to:
    ``output_tokens {median: 250, p95: 1000}``, ``max_output_tokens 4096``,
    ``context_window 200000``, ``tool_call_rate 0.6``, every rate 0.

One provider
    ``behaviour = ProviderBehaviour(spec, random.Random(seed), started_at=now0)``

    ``behaviour.admit(now, CompletionRequest(model, input_tokens, max_tokens=None, tools=(),
    tool_choice="auto", stop_sequences=(), cache_control=False, response_schema=None,
    thinking_budget=None)) -> Plan | Rejection``

    - ``Rejection``: ``status`` 429 (limits), 404 (unknown model) or 400 (prompt longer than the
      context window); ``reason`` (``requests_per_minute``, ``input_tokens_per_minute``,
      ``output_tokens_per_minute``, ``concurrency``, ``requests_per_day``, ``request_too_large``,
      ``model_not_found``, ``context_length_exceeded``); ``retryable`` (False for the daily limit
      and for requests larger than a bucket); ``retry_after_s`` (exact seconds until the request
      would fit, None when not retryable; ``retry_after_header`` is the integer ``Retry-After``);
      ``limits``. Nothing was debited; do not call ``finish``.
    - ``Plan``: admitted and debited. ``ttft_s``, ``tokens_per_s``, ``output_tokens``,
      ``stop_reason`` (``end`` / ``max_tokens`` / ``tool_use`` / ``stop_sequence``),
      ``tool_call`` (name, ``arguments_json``, ``malformed``), ``answer_json`` (a structured
      answer), ``thinking_tokens`` (the first of ``output_tokens``), ``input_tokens``,
      ``cached_input_tokens``, ``cache_creation_input_tokens``, ``reserved_output_tokens``,
      ``failure`` (None, or ``status`` 500 / 503 / 529 with ``after_tokens``: 0 = fails at once),
      ``limits``. Derived: ``status``, ``tokens_to_send``, ``duration_s``,
      ``tokens_sent_by(elapsed_s)``.

    ``behaviour.finish(now, plan, output_tokens_sent, disconnected=False)`` exactly once per
    plan: frees the concurrency slot, refunds ``reserved_output_tokens - output_tokens_sent`` to
    the output-token bucket, counts the response. A discrete-event driver admits at ``t``,
    schedules ``finish(t + plan.duration_s, plan, plan.tokens_to_send)``, and may cancel earlier
    with ``plan.tokens_sent_by(elapsed)`` and ``disconnected=True``.

    Also: ``start_incident(now, IncidentSpec(at=0, duration=30, model=..., error_rate=...))``,
    ``active_incidents(now)``, ``model_at(now, model)`` (effective parameters),
    ``limit_status(now) -> LimitStatus`` (``.get(dimension)`` → ``DimensionStatus(dimension,
    limit, remaining, reset_s)``, ``reset_s`` = seconds until full; dimensions ``requests``,
    ``input_tokens``, ``output_tokens``, ``requests_per_day``, ``concurrency``, only those
    configured), ``in_flight``, ``counters`` / ``stats()`` (JSON-ready) / ``reset_counters()``.
    A client that hung up is counted under status 499 (``CLIENT_CLOSED``).

Rules
    Limits: token buckets of the per-minute capacity, full at ``started_at``, refilling
    continuously; the request bucket takes 1, the input bucket the whole prompt (cached tokens
    included), the output bucket ``max_tokens`` or the model's ``max_output_tokens``; refunds at
    ``finish``. ``requests_per_day`` is a fixed window per day (``floor(now / 86400)``).
    Checks run daily → bucket sizes → buckets (the longest wait names the reason) →
    concurrency; all dimensions are debited together or not at all.
    Output length: a tool call (when tools are given and ``tool_choice`` is ``required``, a tool
    name, or ``auto`` with probability ``tool_call_rate``) costs its arguments' tokens + name + 5;
    otherwise a draw from the model's ``output_tokens`` lognormal (at least 1). Either is capped
    at ``max_tokens`` (or ``max_output_tokens``); hitting the cap stops with ``max_tokens``.
    A tool call's arguments are valid against the tool's schema (unless drawn malformed), and
    without a tool call a ``response_schema`` makes the answer JSON valid against it, as long
    as its tokens (cut off at the cap); see ``jsonvalues`` for the schema subset.
    Thinking (``thinking_budget``): a draw of the output length, at most the budget and one
    token less than the cap, spent before the answer and counted in its output tokens.
    Caching: prompts of at least 1024 tokens hit with probability ``cache_hit_rate``; the hit
    covers 60–95 % of the prompt in 128-token blocks (at least 1024).
    Conversation-aware caching (``ProviderBehaviour(..., prompt_cache_ttl_s=300)``, used by the
    switchback experiment): a request naming a ``conversation`` hits with probability
    ``cache_hit_rate`` only if that conversation was admitted here within the TTL; the hit
    covers its previous prompt (in 128-token blocks, at least 1024). A request may also fix its
    natural answer length with ``CompletionRequest.output_tokens``.
    Failures: overload with probability ``overload_rate`` (at once), else a 500 with probability
    ``error_rate`` (half of them after a uniform part of the output).
    Prompt tokens: ``count_prompt_tokens(messages, tools)`` (see ``tokenizer``).
"""

from simulator.model._reader import MarketError
from simulator.model.behaviour import EffectiveModel, ProviderBehaviour, ScheduledIncident
from simulator.model.counters import CLIENT_CLOSED, ModelCounters, ProviderCounters
from simulator.model.distributions import LogNormal
from simulator.model.durations import parse_duration
from simulator.model.limits import (
    Dimension,
    DimensionStatus,
    LimitStatus,
    ProviderLimits,
    RejectionReason,
    TokenBucket,
)
from simulator.model.market import (
    IncidentSpec,
    LatencySpec,
    LengthSpec,
    LimitsSpec,
    ModelSpec,
    ProviderSpec,
    ThroughputSpec,
)
from simulator.model.outcomes import Failure, Plan, Rejection, StopReason, ToolCall
from simulator.model.request import CompletionRequest, ToolSpec
from simulator.model.tokenizer import count_prompt_tokens, count_text_tokens, generate_pieces
from simulator.model.traffic import (
    ArrivalSpec,
    ExperimentSpec,
    Market,
    TrafficModelSpec,
    TrafficSpec,
    TurnsSpec,
    WhaleSpec,
    parse_market,
    parse_market_text,
)

__all__ = [
    "CLIENT_CLOSED",
    "ArrivalSpec",
    "CompletionRequest",
    "Dimension",
    "DimensionStatus",
    "EffectiveModel",
    "ExperimentSpec",
    "Failure",
    "IncidentSpec",
    "LatencySpec",
    "LengthSpec",
    "LimitStatus",
    "LimitsSpec",
    "LogNormal",
    "Market",
    "MarketError",
    "ModelCounters",
    "ModelSpec",
    "Plan",
    "ProviderBehaviour",
    "ProviderCounters",
    "ProviderLimits",
    "ProviderSpec",
    "Rejection",
    "RejectionReason",
    "ScheduledIncident",
    "StopReason",
    "ThroughputSpec",
    "TokenBucket",
    "ToolCall",
    "ToolSpec",
    "TrafficModelSpec",
    "TrafficSpec",
    "TurnsSpec",
    "WhaleSpec",
    "count_prompt_tokens",
    "count_text_tokens",
    "generate_pieces",
    "parse_duration",
    "parse_market",
    "parse_market_text",
]
