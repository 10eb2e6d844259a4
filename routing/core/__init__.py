"""Pure core of the routing-cost router (SPEC G1–G14): no Django, no Redis, time is an argument."""

from routing.core.catalogue import EndpointConfig, ModelConfig
from routing.core.overrides import (
    ProviderPreferences,
    model_suffix_split,
    provider_preferences_parse,
)
from routing.core.parameters import RoutingParameters
from routing.core.planner import Plan, RoutingRequest, plan_build, plan_explanation
from routing.core.router import Router
from routing.core.stats import Outcome, endpoint_observe, stats_merge
from routing.core.sticky import StickyState, conversation_key

__all__ = [
    "EndpointConfig",
    "ModelConfig",
    "Outcome",
    "Plan",
    "ProviderPreferences",
    "Router",
    "RoutingParameters",
    "RoutingRequest",
    "StickyState",
    "conversation_key",
    "endpoint_observe",
    "model_suffix_split",
    "plan_build",
    "plan_explanation",
    "provider_preferences_parse",
    "stats_merge",
]
