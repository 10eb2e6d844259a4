"""The provider part of a market file: providers, their limits, models and incidents.

Every field of ``config/market.yaml`` maps to a frozen dataclass here (``traffic`` and
``experiment`` live in :mod:`simulator.model.traffic`). Parsing refuses unknown fields and
names the field path of every problem, e.g. ``providers[1].models.chat-large.ttft_ms.p95``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from simulator.model._reader import MarketError, Node
from simulator.model.distributions import LogNormal

Protocol = Literal["openai", "anthropic"]
PROTOCOLS: tuple[Protocol, ...] = ("openai", "anthropic")

# Defaults for model fields the example market leaves out (documented in the module docstring
# of simulator.model): typical chat answers, a common max_tokens default, a 200k window.
DEFAULT_OUTPUT_MEDIAN = 250
DEFAULT_OUTPUT_P95 = 1000
DEFAULT_MAX_OUTPUT_TOKENS = 4096
DEFAULT_CONTEXT_WINDOW = 200_000
DEFAULT_TOOL_CALL_RATE = 0.6


@dataclass(frozen=True)
class LatencySpec:
    """Time to first token in milliseconds: median and 95th percentile."""

    median_ms: float
    p95_ms: float

    def distribution_s(self) -> LogNormal:
        """The lognormal of TTFT in seconds."""
        return LogNormal.from_median_p95(self.median_ms / 1000.0, self.p95_ms / 1000.0)


@dataclass(frozen=True)
class ThroughputSpec:
    """Streaming speed in output tokens per second: median and 5th percentile (the slow tail)."""

    median: float
    p05: float

    def distribution(self) -> LogNormal:
        return LogNormal.from_median_p05(self.median, self.p05)


@dataclass(frozen=True)
class LengthSpec:
    """A token count: median and 95th percentile."""

    median: float
    p95: float

    def distribution(self) -> LogNormal:
        return LogNormal.from_median_p95(self.median, self.p95)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    ttft_ms: LatencySpec
    tokens_per_s: ThroughputSpec
    error_rate: float = 0.0  # → 500
    overload_rate: float = 0.0  # → 503 (openai) / 529 (anthropic)
    cache_hit_rate: float = 0.0
    malformed_tool_call_rate: float = 0.0
    tool_call_rate: float = DEFAULT_TOOL_CALL_RATE  # share of tool_choice=auto requests that call
    output_tokens: LengthSpec = LengthSpec(DEFAULT_OUTPUT_MEDIAN, DEFAULT_OUTPUT_P95)
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS  # used when a request has no max_tokens
    context_window: int = DEFAULT_CONTEXT_WINDOW
    # An embedding model: the length of its vectors (``dimensions`` may ask for fewer). It
    # answers ``/v1/embeddings`` only; a chat model answers everything else.
    embedding_dimensions: int | None = None


@dataclass(frozen=True)
class LimitsSpec:
    """Provider-side limits; ``None`` means not enforced (and no headers for it)."""

    requests_per_minute: int | None = None
    input_tokens_per_minute: int | None = None
    output_tokens_per_minute: int | None = None
    concurrency: int | None = None
    requests_per_day: int | None = None


@dataclass(frozen=True)
class IncidentSpec:
    """While active, the given fields replace the model's own (``model=None``: every model).

    ``at`` is seconds after the simulator's start; ``duration`` is the YAML field ``for``.
    """

    at: float
    duration: float
    model: str | None = None
    error_rate: float | None = None
    overload_rate: float | None = None
    cache_hit_rate: float | None = None
    malformed_tool_call_rate: float | None = None
    ttft_ms: LatencySpec | None = None
    tokens_per_s: ThroughputSpec | None = None

    def applies_to(self, model: str) -> bool:
        return self.model is None or self.model == model

    def apply(self, spec: ModelSpec) -> ModelSpec:
        """``spec`` with this incident's overrides."""
        changes: dict[str, Any] = {
            name: getattr(self, name) for name in _OVERRIDABLE if getattr(self, name) is not None
        }
        return replace(spec, **changes) if changes else spec


_OVERRIDABLE = (
    "error_rate",
    "overload_rate",
    "cache_hit_rate",
    "malformed_tool_call_rate",
    "ttft_ms",
    "tokens_per_s",
)


@dataclass(frozen=True)
class KeySpec:
    """One API key of the provider organisation (SPEC B2), with limits of its own on top of the
    organisation's ``limits``; a revoked key is answered 401, like a key the provider deleted."""

    name: str
    key: str
    limits: LimitsSpec = LimitsSpec()
    revoked: bool = False


@dataclass(frozen=True)
class BatchSpec:
    """The provider's batch API (OpenAI's batches, Anthropic's message batches): lines are
    answered by the same behaviour as live calls, outside the rate limits (a separate queue),
    billed at ``1 - discount`` of the live price, all done ``turnaround`` seconds after the
    batch was created (scaled by the simulator's latency scale), spread evenly over it."""

    discount: float = 0.5
    turnaround: float = 30.0


@dataclass(frozen=True)
class ProviderSpec:
    name: str
    port: int
    protocol: Protocol
    limits: LimitsSpec
    models: Mapping[str, ModelSpec]
    incidents: tuple[IncidentSpec, ...] = field(default=())
    # Empty: any key is accepted (one organisation, one key). Else only these keys are.
    keys: tuple[KeySpec, ...] = field(default=())
    # None: the provider offers no batch API (its batch paths answer 404).
    batch: BatchSpec | None = None


_LATENCY_FIELDS = frozenset({"median", "p95"})
_THROUGHPUT_FIELDS = frozenset({"median", "p05"})
_MODEL_FIELDS = frozenset(
    {"ttft_ms", "tokens_per_s", "output_tokens", "max_output_tokens", "context_window"}
    | {"error_rate", "overload_rate", "cache_hit_rate", "malformed_tool_call_rate"}
    | {"tool_call_rate", "embedding_dimensions"}
)
_LIMIT_FIELDS = frozenset(
    {"requests_per_minute", "input_tokens_per_minute", "output_tokens_per_minute"}
    | {"concurrency", "requests_per_day"}
)
_INCIDENT_FIELDS = frozenset({"model", "at", "for", *_OVERRIDABLE})
_PROVIDER_FIELDS = frozenset(
    {"name", "port", "protocol", "limits", "models", "incidents", "keys", "batch"}
)
_BATCH_FIELDS = frozenset({"discount", "turnaround"})
_KEY_FIELDS = frozenset({"name", "key", "limits", "revoked"})


def parse_latency(node: Node) -> LatencySpec:
    node.mapping(_LATENCY_FIELDS)
    median, p95 = node.get("median").positive(), node.get("p95").positive()
    if p95 < median:
        raise MarketError(node.child_path("p95"), f"must be at least the median ({median:g})")
    return LatencySpec(median, p95)


def parse_throughput(node: Node) -> ThroughputSpec:
    node.mapping(_THROUGHPUT_FIELDS)
    median, p05 = node.get("median").positive(), node.get("p05").positive()
    if p05 > median:
        raise MarketError(node.child_path("p05"), f"must be at most the median ({median:g})")
    return ThroughputSpec(median, p05)


def parse_length(node: Node) -> LengthSpec:
    node.mapping(_LATENCY_FIELDS)
    median, p95 = node.get("median").positive(), node.get("p95").positive()
    if p95 < median:
        raise MarketError(node.child_path("p95"), f"must be at least the median ({median:g})")
    return LengthSpec(median, p95)


def parse_model(name: str, node: Node) -> ModelSpec:
    node.mapping(_MODEL_FIELDS)
    spec = ModelSpec(
        name=name,
        ttft_ms=parse_latency(node.get("ttft_ms")),
        tokens_per_s=parse_throughput(node.get("tokens_per_s")),
    )
    rates = {
        key: node.get(key).rate()
        for key in (
            "error_rate",
            "overload_rate",
            "cache_hit_rate",
            "malformed_tool_call_rate",
            "tool_call_rate",
        )
        if node.has(key)
    }
    if rates.get("error_rate", 0.0) + rates.get("overload_rate", 0.0) > 1.0:
        raise MarketError(node.child_path("overload_rate"), "error_rate + overload_rate exceed 1")
    extra: dict[str, Any] = dict(rates)
    if node.has("output_tokens"):
        extra["output_tokens"] = parse_length(node.get("output_tokens"))
    if node.has("max_output_tokens"):
        extra["max_output_tokens"] = node.get("max_output_tokens").integer(minimum=1)
    if node.has("context_window"):
        extra["context_window"] = node.get("context_window").integer(minimum=1)
    if node.has("embedding_dimensions"):
        extra["embedding_dimensions"] = node.get("embedding_dimensions").integer(minimum=1)
    return replace(spec, **extra)


def parse_limits(node: Node) -> LimitsSpec:
    node.mapping(_LIMIT_FIELDS)
    values = {key: node.get(key).integer(minimum=1) for key in _LIMIT_FIELDS if node.has(key)}
    return LimitsSpec(**values)


def parse_incident(
    node: Node, models: Mapping[str, ModelSpec], *, default_at: float = 0.0
) -> IncidentSpec:
    """An incident entry; ``at`` may be absent (then ``default_at``), ``for`` is required."""
    node.mapping(_INCIDENT_FIELDS)
    model: str | None = None
    if node.has("model"):
        model = node.get("model").text()
        if model not in models:
            raise MarketError(
                node.child_path("model"),
                f"unknown model {model!r} (this provider serves: {', '.join(sorted(models))})",
            )
    overrides: dict[str, Any] = {
        key: node.get(key).rate()
        for key in ("error_rate", "overload_rate", "cache_hit_rate", "malformed_tool_call_rate")
        if node.has(key)
    }
    if node.has("ttft_ms"):
        overrides["ttft_ms"] = parse_latency(node.get("ttft_ms"))
    if node.has("tokens_per_s"):
        overrides["tokens_per_s"] = parse_throughput(node.get("tokens_per_s"))
    if not overrides:
        raise node.fail(f"overrides nothing (give one of: {', '.join(_OVERRIDABLE)})")
    at = node.get("at").duration(allow_zero=True) if node.has("at") else default_at
    return IncidentSpec(at=at, duration=node.get("for").duration(), model=model, **overrides)


def parse_key(node: Node, index: int) -> KeySpec:
    node.mapping(_KEY_FIELDS)
    revoked = node.get("revoked").value if node.has("revoked") else False
    if not isinstance(revoked, bool):
        raise MarketError(node.child_path("revoked"), "must be true or false")
    return KeySpec(
        name=node.get("name").text() if node.has("name") else f"key-{index + 1}",
        key=node.get("key").text(),
        limits=parse_limits(node.get("limits")) if node.has("limits") else LimitsSpec(),
        revoked=revoked,
    )


def parse_keys(node: Node) -> tuple[KeySpec, ...]:
    keys = tuple(parse_key(item, i) for i, item in enumerate(node.elements()))
    for what in ("name", "key"):
        seen: set[str] = set()
        for index, key in enumerate(keys):
            value = getattr(key, what)
            if value in seen:
                raise MarketError(f"{node.child_path(index)}.{what}", f"duplicate {value!r}")
            seen.add(value)
    return keys


def parse_batch(node: Node) -> BatchSpec:
    node.mapping(_BATCH_FIELDS)
    spec = BatchSpec()
    if node.has("discount"):
        spec = replace(spec, discount=node.get("discount").rate())
    if node.has("turnaround"):
        spec = replace(spec, turnaround=node.get("turnaround").duration(allow_zero=True))
    return spec


def parse_provider(node: Node) -> ProviderSpec:
    node.mapping(_PROVIDER_FIELDS)
    protocol = node.get("protocol").text()
    if protocol not in PROTOCOLS:
        raise MarketError(
            node.child_path("protocol"), f"must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
        )
    models = {name: parse_model(name, child) for name, child in node.get("models").items()}
    if not models:
        raise MarketError(node.child_path("models"), "must name at least one model")
    limits = parse_limits(node.get("limits")) if node.has("limits") else LimitsSpec()
    incidents: tuple[IncidentSpec, ...] = ()
    if node.has("incidents"):
        incidents = tuple(parse_incident(item, models) for item in node.get("incidents").elements())
    keys = parse_keys(node.get("keys")) if node.has("keys") else ()
    return ProviderSpec(
        name=node.get("name").text(),
        port=node.get("port").integer(minimum=0, maximum=65535),
        protocol="openai" if protocol == "openai" else "anthropic",
        limits=limits,
        models=models,
        incidents=incidents,
        keys=keys,
        batch=parse_batch(node.get("batch")) if node.has("batch") else None,
    )


def parse_providers(node: Node) -> tuple[ProviderSpec, ...]:
    providers = tuple(parse_provider(item) for item in node.elements())
    if not providers:
        raise node.fail("must list at least one provider")
    names: set[str] = set()
    ports: set[int] = set()
    for index, provider in enumerate(providers):
        if provider.name in names:
            raise MarketError(node.child_path(index) + ".name", f"duplicate {provider.name!r}")
        if provider.port and provider.port in ports:
            raise MarketError(node.child_path(index) + ".port", f"duplicate {provider.port}")
        names.add(provider.name)
        ports.add(provider.port)
    return providers
