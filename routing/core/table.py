"""A model's routing table: everything a request needs, precomputed when stats or config change.

Building a table reads the endpoints' flat stats once (priors, λ, cost coefficients, breaker,
quality flag, backoff, cap bounds, floors); a request then only does a few multiply-adds per
endpoint. Tables are rebuilt at most every ``refresh_interval_s`` (the Redis mirror's period),
so the per-request path never touches a dict of stats or creates a dataclass per endpoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from routing.core.catalogue import PER_MILLION, EndpointConfig, ModelConfig
from routing.core.cost import attempt_coefficients, attempts_per_good_answer, time_value
from routing.core.guards import (
    backoff_multiplier,
    breaker_open,
    cap_share,
    half_open_share,
    quality_flagged,
)
from routing.core.legacy import price_only_shares
from routing.core.parameters import RoutingParameters
from routing.core.stats import (
    EndpointEstimate,
    ModelFigures,
    State,
    decay_factor,
    endpoint_estimate,
    model_figures,
)

EMPTY: State = {}


class ModelTable:
    """Parallel per-endpoint lists for one model (index i is ``endpoints[i]``)."""

    __slots__ = (
        "all_supports",
        "any_supports",
        "breaker_closed_at",
        "breaker_trips",
        "built_at",
        "coef_const",
        "coef_in",
        "coef_out",
        "demoted",
        "endpoints",
        "estimates",
        "figures",
        "index",
        "inv_checked",
        "inv_plain",
        "lam",
        "legacy_outage",
        "legacy_shares",
        "lower",
        "min_context",
        "min_max_output",
        "model",
        "multiplier",
        "params",
        "plain",
        "price_out",
        "refused",
        "speed_noise",
        "ttft",
        "upper",
        "wait_const",
        "wait_per_token",
    )

    def __init__(self, model: ModelConfig, built_at: float) -> None:
        self.model = model
        self.params: RoutingParameters = model.params
        self.built_at = built_at
        self.endpoints: list[EndpointConfig] = [e for e in model.endpoints if e.active]
        # Inactive endpoints are refused for every request: reported, never planned.
        self.refused: list[tuple[str, str]] = [
            (e.id, "inactive") for e in model.endpoints if not e.active
        ]
        self.index: dict[str, int] = {}
        for i, e in enumerate(self.endpoints):
            self.index[e.id] = i
            self.index.setdefault(e.provider, i)
        self.min_context = min((e.context_window for e in self.endpoints), default=0)
        self.min_max_output = min((e.max_output for e in self.endpoints), default=0)
        supports = [e.supports for e in self.endpoints]
        self.all_supports: frozenset[str] = (
            frozenset.intersection(*supports) if supports else frozenset()
        )
        self.any_supports: frozenset[str] = frozenset().union(*supports)
        self.estimates: list[EndpointEstimate] = []
        self.figures: ModelFigures | None = None
        self.lam = 0.0
        self.coef_in: list[float] = []
        self.coef_out: list[float] = []
        self.coef_const: list[float] = []
        self.price_out: list[float] = [e.price_output * PER_MILLION for e in self.endpoints]
        self.inv_plain: list[float] = []
        self.inv_checked: list[float] = []
        self.multiplier: list[float] = []  # backoff; 0 = breaker open or flagged
        self.demoted: list[str] = []  # "" or "breaker" / "flagged"
        self.breaker_closed_at: list[float] = []  # when each breaker last closed (-inf: never)
        self.breaker_trips: list[int] = []  # consecutive openings, each in the last's half-open
        self.lower: list[float] = []  # floor or probe share
        self.upper: list[float] = []  # cap bound
        self.legacy_outage: list[bool] = []  # for the price-only router
        # The default guards' baseline (guards.speed_guard): price-only's shares over every
        # endpoint, and the wait the routing cost prices, w_e = wait_const_e + O·wait_per_token_e
        # with wait_const_e = (1 + ttft_weight)·ttft_e (G4, G5); and how far those estimates
        # may be off, relative, one standard error: speed_spread / √(2n), n the decayed count of
        # answers they rest on (a decayed mean at a steady rate weighs as 2n equal answers).
        self.legacy_shares: list[float] = []
        self.ttft: list[float] = []
        self.speed_noise: list[float] = []
        self.wait_const: list[float] = []
        self.wait_per_token: list[float] = []
        # The table for requests whose output is not checked (no tools, no response_format):
        # the quality flag (malformed tool calls, G8) says nothing about their answers, so it
        # does not demote there. ``self`` when no endpoint is flagged for quality alone.
        self.plain: ModelTable = self

    def guards_variant(self) -> ModelTable:
        """A table sharing every list of this one except the guards' (``_guards_fill`` sets
        them): lists filled later are filled for both."""
        other = ModelTable(self.model, self.built_at)
        other.estimates, other.figures, other.lam = self.estimates, self.figures, self.lam
        other.coef_in, other.coef_out, other.coef_const = (
            self.coef_in,
            self.coef_out,
            self.coef_const,
        )
        other.price_out = self.price_out
        other.inv_plain, other.inv_checked = self.inv_plain, self.inv_checked
        other.breaker_closed_at, other.legacy_outage = self.breaker_closed_at, self.legacy_outage
        other.breaker_trips = self.breaker_trips
        other.legacy_shares, other.ttft = self.legacy_shares, self.ttft
        other.wait_const, other.wait_per_token = self.wait_const, self.wait_per_token
        other.speed_noise = self.speed_noise
        return other

    def price_per_token(self, i: int) -> tuple[float, float]:
        """(effective input, output) USD per token of endpoint i at its measured hit rate."""
        return self.coef_in[i], self.price_out[i]

    def e2e_tokens_per_s(self, i: int, output_tokens: float) -> float:
        """End-to-end throughput of endpoint i for an answer of ``output_tokens``."""
        est = self.estimates[i]
        return output_tokens / (est.ttft_s + output_tokens / est.tokens_per_s)


def _held_fault_rate(
    state: State, figures: ModelFigures, now: float, params: RoutingParameters, trips: int
) -> float:
    """The recent fault rate with ``breaker_hold_prior`` pseudo-attempts: what keeps a breaker
    open. Recent: over the backoff window, so that how long a breaker holds after its endpoint
    recovered grows little with how busy the endpoint was before (G11). Since the last news it
    fades slower after each consecutive trip (``breaker_trip_factor_max``); news — a probe's
    answers — counts as it comes."""
    factor = min(2.0 ** max(trips - 1, 0), params.breaker_trip_factor_max)
    d = decay_factor(now - state.get("t", now), params.backoff_half_life_s * factor)
    limited = state.get("brl", 0.0)
    answered = max(state.get("bn", 0.0) - limited, 0.0) * d
    faults = max(state.get("bf", 0.0) - limited, 0.0) * d
    weight = params.breaker_hold_prior
    if answered + weight <= 0.0:
        return figures.fault_rate
    return (faults + weight * figures.fault_rate) / (answered + weight)


def _trips(
    trips: int, was_open: bool, is_open: bool, since_closed: float, params: RoutingParameters
) -> int:
    """Consecutive trips of a breaker: one more when it opens within the half-open spell after
    the last (the endpoint still fails), none once it has stayed closed through that spell."""
    if is_open and not was_open:
        return trips + 1 if since_closed < params.fast_half_life_s else 1
    if not is_open and since_closed >= params.fast_half_life_s:
        return 0
    return trips


def _guards_fill(table: ModelTable, demoted: list[str]) -> None:
    """The guards' share bounds (G7, G8, G10) given which endpoints are ``demoted``: probe share
    for those; for the others the backoff multiplier, the floor and the cap bound."""
    p, figures = table.params, table.figures
    assert figures is not None
    estimates = table.estimates
    model_rate = sum(est.attempt_rate for est in estimates)
    healthy = demoted.count("")
    floor = min(p.floor_share, p.floor_total / healthy) if healthy else 0.0
    expected = figures.fault_rate + figures.rate_limited_rate
    table.demoted = demoted
    table.multiplier, table.lower, table.upper = [], [], []
    for est, why, closed_at in zip(estimates, demoted, table.breaker_closed_at, strict=True):
        if why:
            table.multiplier.append(0.0)
            table.lower.append(p.probe_share)
            table.upper.append(p.probe_share)
        else:
            table.multiplier.append(backoff_multiplier(est.backoff_failure_rate, expected, p))
            table.lower.append(floor)
            half_open = half_open_share(table.built_at - closed_at, max(floor, p.probe_share), p)
            table.upper.append(max(floor, min(cap_share(est.cap_rps, model_rate), half_open)))


def table_build(
    model: ModelConfig,
    states: Mapping[str, State],
    traffic: State,
    now: float,
    previous: ModelTable | None = None,
) -> ModelTable:
    """Precompute a model's table from its config and its endpoints' flat stats at ``now``.

    ``previous`` (the table this one replaces) carries which breakers were open (hysteresis).
    """
    table = ModelTable(model, now)
    p = table.params
    eps = table.endpoints
    raw = [states.get(e.id, EMPTY) for e in eps]
    figures = model_figures(
        raw,
        traffic,
        now,
        p,
        default_input_tokens=model.default_input_tokens or p.default_input_tokens,
        default_output_tokens=model.default_output_tokens,
    )
    table.figures = figures
    estimates = [endpoint_estimate(s, figures, now, p) for s in raw]
    table.estimates = estimates
    lam = time_value(eps, estimates, figures, p)
    table.lam = lam
    # Hysteresis (G7): an open breaker, or one that closed within a fast half-life (half-open),
    # is judged by the weak-prior fault rate — failing probes keep it open, and a failure soon
    # after it closed reopens it before the endpoint's full share is back on it.
    was_open = [False] * len(eps)
    closed_at = [-math.inf] * len(eps)
    trips = [0] * len(eps)
    probation = held = None
    if previous is not None and [e.id for e in previous.endpoints] == [e.id for e in eps]:
        was_open = [d == "breaker" for d in previous.demoted]
        closed_at, trips = previous.breaker_closed_at, previous.breaker_trips
        probation = [
            was_open[i] or now - closed_at[i] < p.fast_half_life_s for i in range(len(eps))
        ]
        held = [_held_fault_rate(s, figures, now, p, trips[i]) for i, s in enumerate(raw)]
    breaker = breaker_open(
        [est.fault_rate for est in estimates], p, probation=probation, held_rates=held
    )
    table.breaker_closed_at = [
        now if was_open[i] and not breaker[i] else closed_at[i] for i in range(len(eps))
    ]
    table.breaker_trips = [
        _trips(trips[i], was_open[i], breaker[i], now - table.breaker_closed_at[i], p)
        for i in range(len(eps))
    ]
    flagged = quality_flagged([est.bad_output_rate for est in estimates], p)
    demoted = [
        "breaker" if breaker[i] else "flagged" if (flagged[i] or e.flagged) else ""
        for i, e in enumerate(eps)
    ]
    _guards_fill(table, demoted)
    if any(flagged[i] and not (breaker[i] or e.flagged) for i, e in enumerate(eps)):
        table.plain = table.guards_variant()
        # An admin's flag (benchmark accuracy) holds for every request; the measured one not.
        _guards_fill(
            table.plain,
            [
                "breaker" if b else "flagged" if e.flagged else ""
                for b, e in zip(breaker, eps, strict=True)
            ],
        )
    for i, (e, est) in enumerate(zip(eps, estimates, strict=True)):
        a, b, c = attempt_coefficients(e, est, lam, p)
        table.coef_in.append(a)
        table.coef_out.append(b)
        table.coef_const.append(c)
        table.inv_plain.append(attempts_per_good_answer(est, p, output_checked=False))
        table.inv_checked.append(attempts_per_good_answer(est, p, output_checked=True))
        # Price-only router: "a significant failure in the last 30 s" = enough recent failures
        # and a large enough share of recent attempts failing (fast window).
        state = raw[i]
        n = state.get("n", 0.0)
        failed = state.get("rl", 0.0) + state.get("flt", 0.0)
        decay = decay_factor(now - state.get("t", now), p.fast_half_life_s)
        outage = (
            n > 0.0
            and failed * decay >= p.legacy_outage_min_failures
            and failed / n >= p.legacy_outage_rate
        )
        table.legacy_outage.append(outage)
        table.ttft.append(est.ttft_s)
        table.wait_const.append((1.0 + p.ttft_weight) * est.ttft_s)
        table.wait_per_token.append(1.0 / est.tokens_per_s)
        table.speed_noise.append(p.speed_spread / math.sqrt(2.0 * max(est.speed_samples, 1.0)))
    table.legacy_shares.extend(price_only_shares([e.price_input for e in eps], table.legacy_outage))
    return table
