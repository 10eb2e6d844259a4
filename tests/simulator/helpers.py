"""Small builders for simulator model tests."""

import random
from pathlib import Path

from simulator.model import (
    CompletionRequest,
    LatencySpec,
    LimitsSpec,
    ModelSpec,
    ProviderBehaviour,
    ProviderSpec,
    ThroughputSpec,
)

REFERENCE_MARKET = Path(__file__).resolve().parents[2] / "config" / "market.yaml"
# The same providers with 3.3x the traffic: capacity, not ranking, decides who is served.
SATURATED_MARKET = REFERENCE_MARKET.parent / "market-saturated.yaml"


def model(name: str = "m", **fields) -> ModelSpec:
    fields.setdefault("ttft_ms", LatencySpec(450, 1400))
    fields.setdefault("tokens_per_s", ThroughputSpec(70, 30))
    return ModelSpec(name=name, **fields)


def provider(
    *, protocol: str = "openai", limits: LimitsSpec | None = None, models=None, incidents=()
) -> ProviderSpec:
    models = models or [model()]
    return ProviderSpec(
        name="p",
        port=0,
        protocol=protocol,
        limits=limits or LimitsSpec(),
        models={m.name: m for m in models},
        incidents=tuple(incidents),
    )


def behaviour(spec: ProviderSpec | None = None, *, seed: int = 1, started_at: float = 0.0):
    return ProviderBehaviour(spec or provider(), random.Random(seed), started_at)


def request(model_name: str = "m", input_tokens: int = 100, **fields) -> CompletionRequest:
    return CompletionRequest(model=model_name, input_tokens=input_tokens, **fields)


REFERENCE_MARKET = (
    __import__("pathlib").Path(__file__).resolve().parents[2] / "config" / "market.yaml"
)
