"""One provider's behaviour: limits, latency, throughput, errors, caching, tool calls, incidents."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace

from simulator.model.counters import CLIENT_CLOSED, ProviderCounters
from simulator.model.distributions import LogNormal
from simulator.model.jsonvalues import generate_value
from simulator.model.limits import LimitStatus, ProviderLimits, RejectionReason, status_merged
from simulator.model.market import IncidentSpec, ModelSpec, ProviderSpec
from simulator.model.outcomes import Failure, Plan, Rejection, StopReason, ToolCall
from simulator.model.request import CompletionRequest, ToolSpec
from simulator.model.tokenizer import count_text_tokens
from simulator.model.toolcalls import broken_json, generate_arguments, schema_violation

# Prompt caching as OpenAI and Anthropic do it: prompts under 1024 tokens are never cached, hits
# cover a prefix in 128-token blocks.
MIN_CACHEABLE_TOKENS = 1024
CACHE_BLOCK_TOKENS = 128
TOOL_CALL_OVERHEAD = 5  # tokens a tool call costs beyond its name and arguments
MIN_TOKENS_PER_S = 0.5  # the lognormal tail must not stall a stream for minutes per token
MIDWAY_FAILURE_SHARE = 0.5  # share of 500s that break a started answer rather than fail at once
STOP_SEQUENCE_SHARE = 0.5  # share of natural ends attributed to a given stop sequence
# Conversation-aware caching forgets conversations idle longer than the TTL; the table is swept
# when it has doubled since the last sweep, so its upkeep stays O(1) per request.
MIN_SWEEP_SIZE = 1024


@dataclass(frozen=True)
class ScheduledIncident:
    starts_at: float
    ends_at: float
    incident: IncidentSpec

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at


@dataclass(frozen=True)
class EffectiveModel:
    """A model with the active incidents applied, and its fitted distributions."""

    spec: ModelSpec
    ttft_s: LogNormal
    tokens_per_s: LogNormal
    output_tokens: LogNormal


class ProviderBehaviour:
    """The behaviour of one provider on a clock passed in as ``now`` (seconds).

    ``started_at`` anchors the market's incident offsets; ``rng`` is the only randomness.
    ``prompt_cache_ttl_s`` turns on conversation-aware caching: a request naming a conversation
    hits (with probability ``cache_hit_rate``) only if that conversation was served here within
    the TTL, and the hit covers the previous prompt; requests without a conversation keep the
    per-request rule. None (the default, and the live simulator) keeps the per-request rule.
    """

    def __init__(
        self,
        spec: ProviderSpec,
        rng: random.Random,
        started_at: float,
        *,
        prompt_cache_ttl_s: float | None = None,
    ) -> None:
        self.spec = spec
        self.rng = rng
        self.started_at = started_at
        self.limits = ProviderLimits(spec.limits, started_at)
        # B2: each key's own limits, checked before the organisation's; by key name.
        self.key_limits = {
            k.name: ProviderLimits(k.limits, started_at)
            for k in spec.keys
            if any(v is not None for v in vars(k.limits).values())
        }
        self._plan_keys: dict[int, str] = {}
        self.counters = ProviderCounters()
        self.overload_status = 529 if spec.protocol == "anthropic" else 503
        self._incidents = [
            ScheduledIncident(started_at + i.at, started_at + i.at + i.duration, i)
            for i in spec.incidents
        ]
        self._effective: dict[tuple[str, tuple[int, ...]], EffectiveModel] = {}
        self._open: set[int] = set()
        self._serial = 0
        self.prompt_cache_ttl_s = prompt_cache_ttl_s
        # conversation → (last admitted at, its prompt tokens then): the warm prefixes.
        self._prefixes: dict[str, tuple[float, int]] = {}
        self._swept_size = MIN_SWEEP_SIZE

    # -- admission ---------------------------------------------------------------------------

    def admit(
        self, now: float, request: CompletionRequest, key: str | None = None
    ) -> Plan | Rejection:
        """Decide one request at ``now``: refuse it, or plan how it will be served.

        ``key``: the name of the organisation's API key it came with (B2), whose own limits
        apply before the organisation's, and whose headers describe them."""
        known = request.model in self.spec.models
        self.counters.record_request(request.model if known else None)
        if not known:
            return self._reject(now, request.model, 404, "model_not_found", request.input_tokens)
        model = self.model_at(now, request.model)
        if request.input_tokens > model.spec.context_window:
            return self._reject(
                now, request.model, 400, "context_length_exceeded", request.input_tokens
            )
        reserved = 0 if request.embedding else request.max_tokens or model.spec.max_output_tokens
        per_key = self.counters.key(key) if key is not None else None
        if per_key is not None:
            per_key.requests += 1
        own = self.key_limits.get(key) if key is not None else None
        refusal = own.try_admit(now, request.input_tokens, reserved) if own else None
        if refusal is None:
            refusal = self.limits.try_admit(now, request.input_tokens, reserved)
            if refusal is not None and own is not None:
                own.undo_admit(now, request.input_tokens, reserved)
        if refusal is not None:
            self.counters.rate_limited[refusal.reason] += 1
            self.counters.record_response(429, request.model)
            if per_key is not None:
                per_key.rate_limited += 1
            return Rejection(
                status=429,
                reason=refusal.reason,
                retryable=refusal.retryable,
                retry_after_s=refusal.retry_after_s,
                limit=refusal.limit,
                requested=refusal.requested,
                limits=self.limit_status(now, key),
            )
        plan = self._plan(now, request, model, reserved, key)
        if self.spec.protocol == "anthropic" and plan.cached_input_tokens:
            # Anthropic's ITPM does not count prompt-cache reads (research/reliability.md
            # §1.2): checked on the whole prompt, the reads are given back once found.
            self.limits.give_back_input(now, plan.cached_input_tokens)
            if own is not None:
                own.give_back_input(now, plan.cached_input_tokens)
        if key is not None:
            self._plan_keys[plan.serial] = key
        if per_key is not None:
            per_key.admitted += 1
            per_key.input_tokens += plan.input_tokens
        self._open.add(plan.serial)
        counters = self.counters
        counters.peak_concurrency = max(counters.peak_concurrency, self.limits.in_flight)
        counters.input_tokens += plan.input_tokens
        counters.cached_input_tokens += plan.cached_input_tokens
        per_model = counters.model(request.model)
        per_model.input_tokens += plan.input_tokens
        per_model.cached_input_tokens += plan.cached_input_tokens
        return plan

    def plan_batch(self, now: float, request: CompletionRequest) -> Plan | Rejection:
        """Decide one line of a provider batch at ``now``: planned as a live call is (output,
        tool calls, caching, failures, incidents), but outside the rate limits — a provider
        runs batches in a queue of its own — and finished at once: nothing stays open. The
        line is counted in ``counters.batch``, not as a live request."""
        counters = self.counters.batch
        if request.model not in self.spec.models:
            return self._batch_rejection(now, 404, "model_not_found", request.input_tokens)
        model = self.model_at(now, request.model)
        if request.input_tokens > model.spec.context_window:
            rejection = self._batch_rejection(
                now, 400, "context_length_exceeded", request.input_tokens
            )
            return replace(rejection, limit=model.spec.context_window)
        reserved = request.max_tokens or model.spec.max_output_tokens
        plan = self._plan(now, request, model, reserved)
        counters.input_tokens += plan.input_tokens
        if plan.failure is None:
            counters.output_tokens += plan.output_tokens
        return plan

    def _batch_rejection(
        self, now: float, status: int, reason: RejectionReason, requested: int
    ) -> Rejection:
        return Rejection(
            status=status,
            reason=reason,
            retryable=False,
            retry_after_s=None,
            limit=0,
            requested=requested,
            limits=self.limits.status(now),
        )

    def finish(
        self, now: float, plan: Plan, output_tokens_sent: int, *, disconnected: bool = False
    ) -> None:
        """End of an admitted request: free its slot, refund unused output tokens, count it."""
        if plan.serial not in self._open:
            raise ValueError(f"plan {plan.serial} is not open (finished twice?)")
        self._open.discard(plan.serial)
        sent = min(max(0, output_tokens_sent), plan.reserved_output_tokens)
        self.limits.release(now, plan.reserved_output_tokens - sent)
        key = self._plan_keys.pop(plan.serial, None)
        own = self.key_limits.get(key) if key is not None else None
        if own is not None:
            own.release(now, plan.reserved_output_tokens - sent)
        counters = self.counters
        counters.output_tokens += sent
        counters.model(plan.model).output_tokens += sent
        if disconnected:
            counters.disconnects += 1
        counters.record_response(CLIENT_CLOSED if disconnected else plan.status, plan.model)
        if plan.tool_call is not None and plan.status == 200 and not disconnected:
            counters.tool_calls += 1
            counters.malformed_tool_calls += plan.tool_call.malformed

    # -- incidents and state -----------------------------------------------------------------

    def start_incident(self, now: float, incident: IncidentSpec) -> ScheduledIncident:
        """Start ``incident`` ``incident.at`` seconds after ``now`` (usually 0: right away)."""
        if incident.model is not None and incident.model not in self.spec.models:
            raise KeyError(incident.model)
        scheduled = ScheduledIncident(
            now + incident.at, now + incident.at + incident.duration, incident
        )
        self._incidents.append(scheduled)
        self._effective.clear()  # keys are incident indices: keep them meaningful
        return scheduled

    def active_incidents(self, now: float) -> tuple[ScheduledIncident, ...]:
        return tuple(s for s in self._incidents if s.active(now))

    def model_at(self, now: float, model: str) -> EffectiveModel:
        """``model``'s parameters at ``now``, active incidents applied in the order they started."""
        active = tuple(
            index
            for index, scheduled in enumerate(self._incidents)
            if scheduled.active(now) and scheduled.incident.applies_to(model)
        )
        key = (model, active)
        effective = self._effective.get(key)
        if effective is None:
            spec = self.spec.models[model]
            for index in active:
                spec = self._incidents[index].incident.apply(spec)
            effective = EffectiveModel(
                spec,
                spec.ttft_ms.distribution_s(),
                spec.tokens_per_s.distribution(),
                spec.output_tokens.distribution(),
            )
            self._effective[key] = effective
        return effective

    @property
    def in_flight(self) -> int:
        return self.limits.in_flight

    def limit_status(self, now: float, key: str | None = None) -> LimitStatus:
        """The limits as ``key``'s headers describe them (the organisation's without a key)."""
        own = self.key_limits.get(key) if key is not None else None
        if own is None:
            return self.limits.status(now)
        return status_merged(self.limits.status(now), own.status(now))

    def reset_counters(self) -> None:
        """Zero the counters (not the limits); the peak restarts from what is in flight now."""
        self.counters = ProviderCounters(peak_concurrency=self.limits.in_flight)

    def stats(self) -> dict[str, object]:
        return self.counters.as_dict(self.limits.in_flight)

    # -- internals ---------------------------------------------------------------------------

    def _reject(
        self, now: float, model: str, status: int, reason: RejectionReason, requested: int
    ) -> Rejection:
        self.counters.record_response(status, model if model in self.spec.models else None)
        return Rejection(
            status=status,
            reason=reason,
            retryable=False,
            retry_after_s=None,
            limit=self.spec.models[model].context_window if status == 400 else 0,
            requested=requested,
            limits=self.limits.status(now),
        )

    def _plan(
        self,
        now: float,
        request: CompletionRequest,
        model: EffectiveModel,
        reserved: int,
        key: str | None = None,
    ) -> Plan:
        rng, spec = self.rng, model.spec
        cached = created = 0
        if request.embedding:
            pass  # embeddings are not prompt-cached
        elif request.conversation is not None and self.prompt_cache_ttl_s is not None:
            cached = self._conversation_hit(now, request, spec.cache_hit_rate)
        elif request.input_tokens >= MIN_CACHEABLE_TOKENS:
            prefix = _cache_prefix(request.input_tokens, rng.uniform(0.6, 0.95))
            if rng.random() < spec.cache_hit_rate:
                cached = prefix
            elif request.cache_control:
                created = prefix
        ttft = model.ttft_s.sample(rng)
        tokens_per_s = max(MIN_TOKENS_PER_S, model.tokens_per_s.sample(rng))
        thinking = self._thinking_tokens(request, model, reserved)
        output, stop, stop_sequence, tool_call, answer_json = self._output(
            request, model, reserved - thinking
        )
        output += thinking
        failure = self._failure(spec, output)
        self._serial += 1
        return Plan(
            serial=self._serial,
            model=request.model,
            admitted_at=now,
            input_tokens=request.input_tokens,
            cached_input_tokens=cached,
            cache_creation_input_tokens=created,
            reserved_output_tokens=reserved,
            ttft_s=ttft,
            tokens_per_s=tokens_per_s,
            output_tokens=output,
            stop_reason=stop,
            stop_sequence=stop_sequence,
            tool_call=tool_call,
            failure=failure,
            limits=self.limit_status(now, key),
            answer_json=answer_json,
            thinking_tokens=thinking,
        )

    def _conversation_hit(self, now: float, request: CompletionRequest, hit_rate: float) -> int:
        """Cached tokens of a conversation's request: its previous prompt, if still warm here."""
        assert request.conversation is not None and self.prompt_cache_ttl_s is not None
        ttl = self.prompt_cache_ttl_s
        prefixes = self._prefixes
        previous = prefixes.get(request.conversation)
        prefixes[request.conversation] = (now, request.input_tokens)
        if len(prefixes) > 2 * self._swept_size:
            for key in [k for k, (at, _) in prefixes.items() if now - at > ttl]:
                del prefixes[key]
            self._swept_size = max(MIN_SWEEP_SIZE, len(prefixes))
        if previous is None or now - previous[0] > ttl:
            return 0
        blocks = min(previous[1], request.input_tokens) // CACHE_BLOCK_TOKENS
        prefix = blocks * CACHE_BLOCK_TOKENS
        if prefix < MIN_CACHEABLE_TOKENS or self.rng.random() >= hit_rate:
            return 0
        return prefix

    def _output(
        self, request: CompletionRequest, model: EffectiveModel, cap: int
    ) -> tuple[int, StopReason, str | None, ToolCall | None, str | None]:
        rng = self.rng
        if request.embedding:
            return 0, "end", None, None, None
        tool = self._tool_to_call(request, model.spec)
        if tool is not None:
            call = self._tool_call(tool, model.spec)
            needed = count_text_tokens(call.arguments_json) + count_text_tokens(call.name)
            needed += TOOL_CALL_OVERHEAD
            if needed <= cap:
                return needed, "tool_use", None, call, None
            keep = len(call.arguments_json) * cap // needed
            truncated = ToolCall(call.name, call.arguments_json[:keep], call.malformed)
            return cap, "max_tokens", None, truncated, None
        if request.response_schema is not None:
            # Constrained decoding: the answer is the JSON, however long the schema makes it.
            answer = json.dumps(generate_value(request.response_schema, rng), separators=(",", ":"))
            needed = max(1, count_text_tokens(answer))
            if needed <= cap:
                return needed, "end", None, None, answer
            return cap, "max_tokens", None, None, answer[: len(answer) * cap // needed]
        if request.output_tokens is not None:
            drawn = max(1, request.output_tokens)
        else:
            drawn = max(1, round(model.output_tokens.sample(rng)))
        if drawn >= cap:
            return cap, "max_tokens", None, None, None
        if request.stop_sequences and rng.random() < STOP_SEQUENCE_SHARE:
            return drawn, "stop_sequence", rng.choice(request.stop_sequences), None, None
        return drawn, "end", None, None, None

    def _thinking_tokens(self, request: CompletionRequest, model: EffectiveModel, cap: int) -> int:
        """Thinking before the answer: a draw of the model's answer length, within the budget,
        leaving at least one token of the output cap for the answer."""
        if request.thinking_budget is None or cap < 2:
            return 0
        drawn = max(1, round(model.output_tokens.sample(self.rng)))
        return min(drawn, request.thinking_budget, cap - 1)

    def _tool_to_call(self, request: CompletionRequest, spec: ModelSpec) -> ToolSpec | None:
        if not request.tools or request.tool_choice == "none":
            return None
        if request.tool_choice not in ("auto", "required"):
            for tool in request.tools:
                if tool.name == request.tool_choice:
                    return tool
        if request.tool_choice == "auto" and (
            request.follows_tool_result or self.rng.random() >= spec.tool_call_rate
        ):
            return None
        return self.rng.choice(request.tools)

    def _tool_call(self, tool: ToolSpec, spec: ModelSpec) -> ToolCall:
        rng = self.rng
        arguments = generate_arguments(tool.parameters, rng)
        if rng.random() >= spec.malformed_tool_call_rate:
            return ToolCall(tool.name, json.dumps(arguments), False)
        if self.spec.protocol == "anthropic":
            violated = schema_violation(arguments, tool.parameters, rng)
            return ToolCall(tool.name, json.dumps(violated), True)
        return ToolCall(tool.name, broken_json(arguments, rng), True)

    def _failure(self, spec: ModelSpec, output_tokens: int) -> Failure | None:
        draw = self.rng.random()
        if draw < spec.overload_rate:
            return Failure(self.overload_status, "overload", 0)
        if draw < spec.overload_rate + spec.error_rate:
            midway = output_tokens >= 2 and self.rng.random() < MIDWAY_FAILURE_SHARE
            after = self.rng.randint(1, output_tokens - 1) if midway else 0
            return Failure(500, "error", after)
        return None


def _cache_prefix(input_tokens: int, share: float) -> int:
    """The cached prefix: ``share`` of the prompt, in whole blocks, at least the minimum."""
    blocks = math.floor(input_tokens * share / CACHE_BLOCK_TOKENS)
    return max(MIN_CACHEABLE_TOKENS, blocks * CACHE_BLOCK_TOKENS)
