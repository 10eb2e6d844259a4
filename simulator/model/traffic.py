"""The ``traffic`` and ``experiment`` sections of a market file (for the switchback experiment),
and the whole-file entry points :func:`parse_market` and :func:`parse_market_text`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from simulator.model._reader import MarketError, Node
from simulator.model.market import LengthSpec, ProviderSpec, parse_length, parse_providers


@dataclass(frozen=True)
class ArrivalSpec:
    """Request arrivals: mean rate and a daily sine swing (0.5 → between 0.5× and 1.5× the mean)."""

    mean: float
    diurnal_amplitude: float = 0.0


@dataclass(frozen=True)
class TurnsSpec:
    """Turns per conversation (mean)."""

    mean: float


@dataclass(frozen=True)
class TrafficModelSpec:
    """Traffic for one route, named as clients call it (``acme/chat-large``)."""

    name: str
    requests_per_minute: ArrivalSpec
    input_tokens: LengthSpec
    output_tokens: LengthSpec
    tool_share: float = 0.0
    conversation_turns: TurnsSpec = TurnsSpec(1.0)


@dataclass(frozen=True)
class WhaleSpec:
    """A burst of extra traffic on one route; ``duration`` is the YAML field ``for``."""

    model: str
    at: float
    duration: float
    requests_per_minute: float
    pinned_provider: str | None = None


@dataclass(frozen=True)
class TrafficSpec:
    duration: float
    models: Mapping[str, TrafficModelSpec]
    whales: tuple[WhaleSpec, ...] = ()


@dataclass(frozen=True)
class ExperimentSpec:
    """Switchback design: alternate routers every ``block``, discard ``warmup`` after a switch."""

    block: float
    warmup: float
    seed: int


@dataclass(frozen=True)
class Market:
    providers: tuple[ProviderSpec, ...]
    traffic: TrafficSpec | None = None
    experiment: ExperimentSpec | None = None

    def provider(self, name: str) -> ProviderSpec:
        for provider in self.providers:
            if provider.name == name:
                return provider
        raise KeyError(name)


_TRAFFIC_FIELDS = frozenset({"duration", "models", "whales"})
_TRAFFIC_MODEL_FIELDS = frozenset(
    {"requests_per_minute", "input_tokens", "output_tokens", "tool_share", "conversation_turns"}
)
_WHALE_FIELDS = frozenset({"model", "at", "for", "requests_per_minute", "pinned_provider"})
_EXPERIMENT_FIELDS = frozenset({"block", "warmup", "seed"})
_MARKET_FIELDS = frozenset({"providers", "traffic", "experiment"})


def _parse_arrival(node: Node) -> ArrivalSpec:
    node.mapping(frozenset({"mean", "diurnal_amplitude"}))
    amplitude = node.get("diurnal_amplitude").rate() if node.has("diurnal_amplitude") else 0.0
    return ArrivalSpec(mean=node.get("mean").positive(), diurnal_amplitude=amplitude)


def _parse_traffic_model(name: str, node: Node) -> TrafficModelSpec:
    node.mapping(_TRAFFIC_MODEL_FIELDS)
    turns = TurnsSpec(1.0)
    if node.has("conversation_turns"):
        turns_node = node.get("conversation_turns")
        turns_node.mapping(frozenset({"mean"}))
        turns = TurnsSpec(turns_node.get("mean").number(minimum=1.0))
    return TrafficModelSpec(
        name=name,
        requests_per_minute=_parse_arrival(node.get("requests_per_minute")),
        input_tokens=parse_length(node.get("input_tokens")),
        output_tokens=parse_length(node.get("output_tokens")),
        tool_share=node.get("tool_share").rate() if node.has("tool_share") else 0.0,
        conversation_turns=turns,
    )


def _parse_whale(
    node: Node, models: Mapping[str, TrafficModelSpec], providers: set[str]
) -> WhaleSpec:
    node.mapping(_WHALE_FIELDS)
    model = node.get("model").text()
    if model not in models:
        raise MarketError(
            node.child_path("model"), f"unknown traffic model {model!r} (see traffic.models)"
        )
    pinned: str | None = None
    if node.has("pinned_provider"):
        pinned = node.get("pinned_provider").text()
        if pinned not in providers:
            raise MarketError(node.child_path("pinned_provider"), f"unknown provider {pinned!r}")
    return WhaleSpec(
        model=model,
        at=node.get("at").duration(allow_zero=True),
        duration=node.get("for").duration(),
        requests_per_minute=node.get("requests_per_minute").positive(),
        pinned_provider=pinned,
    )


def parse_traffic(node: Node, providers: tuple[ProviderSpec, ...]) -> TrafficSpec:
    node.mapping(_TRAFFIC_FIELDS)
    models = {name: _parse_traffic_model(name, child) for name, child in node.get("models").items()}
    if not models:
        raise MarketError(node.child_path("models"), "must name at least one model")
    whales: tuple[WhaleSpec, ...] = ()
    if node.has("whales"):
        names = {provider.name for provider in providers}
        whales = tuple(_parse_whale(item, models, names) for item in node.get("whales").elements())
    return TrafficSpec(duration=node.get("duration").duration(), models=models, whales=whales)


def parse_experiment(node: Node) -> ExperimentSpec:
    node.mapping(_EXPERIMENT_FIELDS)
    block = node.get("block").duration()
    warmup = node.get("warmup").duration(allow_zero=True)
    if warmup >= block:
        raise MarketError(node.child_path("warmup"), "must be shorter than the block")
    return ExperimentSpec(block=block, warmup=warmup, seed=node.get("seed").integer())


def parse_market(data: Any) -> Market:
    """A Market from an already-decoded tree (YAML or JSON); raises MarketError."""
    root = Node(data)
    root.mapping(_MARKET_FIELDS)
    providers = parse_providers(root.get("providers"))
    traffic = parse_traffic(root.get("traffic"), providers) if root.has("traffic") else None
    experiment = parse_experiment(root.get("experiment")) if root.has("experiment") else None
    return Market(providers=providers, traffic=traffic, experiment=experiment)


def parse_market_text(text: str) -> Market:
    """A Market from YAML text; raises MarketError (also for YAML syntax errors)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise MarketError("", f"not valid YAML: {error}") from None
    return parse_market(data)
