"""The attempt plan (SPEC G1–G14): which endpoints to try, in which order, and why.

Per model: estimate the request's tokens (G2), drop endpoints that cannot serve it (context
window, max output, provider filters, max_price, require_parameters), price every candidate by
routing cost, order them by the chosen strategy (routing-cost shares bounded by the cost guard,
with a weighted random draw; a sort, the client's ``order``, or the price-only baseline), keep a
warm conversation where it is (G12) and move deprioritised endpoints last. Fallback models
follow in request order.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from routing.core.capacity import CapacityView, capacity_costs, capacity_refusal
from routing.core.catalogue import DEFAULT_MAX_COST_PREMIUM, EndpointConfig
from routing.core.contracts import FallbackContract, contract_breach, contract_narrow
from routing.core.cost import wait_seconds
from routing.core.eligibility import candidates
from routing.core.guards import cost_guard, fill, mix_mean, speed_guard
from routing.core.legacy import price_only_order, price_only_shares
from routing.core.overrides import (
    ProviderPreferences,
    model_suffix_split,
    strategy_choose,
)
from routing.core.scarcity import ScarcityView, scarcity_costs
from routing.core.shares import band_weights, weighted_order
from routing.core.sticky import StickyState, sticky_decide
from routing.core.table import ModelTable

NO_PREFERENCES = ProviderPreferences()
CHECKED_FEATURES = frozenset({"tools", "response_format"})


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """What the router needs from a request; token counts None = estimate from traffic (G2)."""

    model: str  # may carry a :floor / :nitro suffix
    input_tokens: float | None = None
    output_tokens: float | None = None
    max_tokens: int | None = None
    features: frozenset[str] = frozenset()  # tools, response_format, stream, …
    provider: ProviderPreferences = NO_PREFERENCES
    models: tuple[str, ...] = ()  # fallback models, tried after ``model``
    tenant_sort: str | None = None
    sticky: StickyState | None = None
    # F5: a request re-planned on another model (E2's degrade to ``fallback_model``) keeps the
    # first route's contract, with that route's first choice and its price as the reference;
    # then every attempt of this plan is a fallback.
    contract_reference: ContractReference | None = None
    # F5: the request's workload class's contract, which narrows its route's (never widens).
    contract: FallbackContract | None = None
    # Seconds the request may wait for capacity (its workload's deadline): endpoints the
    # broker said will not have room sooner are left out of the plan (``capacity``).
    deadline_s: float | None = None


@dataclass(frozen=True, slots=True)
class ContractReference:
    contract: FallbackContract
    first: EndpointConfig
    first_price: float
    first_wait: float = 0.0


@dataclass(frozen=True, slots=True)
class Plan:
    """Endpoints to try in order (G14), with what the G15 explanation header needs."""

    attempts: tuple[EndpointConfig, ...]
    costs: tuple[float, ...]  # routing cost (USD per good answer) of each attempt
    strategy: str
    sticky: bool = False
    sticky_reason: str = ""  # why a pinned conversation stayed or moved
    refused: tuple[tuple[str, str], ...] = ()  # (endpoint or model id, reason): not planned
    demoted: tuple[tuple[str, str], ...] = ()  # (endpoint id, reason): planned, but last
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    # Endpoints whose cap bound held this request's share down (G10): demand the cap refused.
    capped: tuple[str, ...] = ()
    # The cost guard moved share toward the cheapest endpoint: (premium before, after).
    cost_guard: tuple[float, float] | None = None
    # The speed guard moved share toward faster endpoints (no slower than price-only's mix).
    speed_guard: bool = False
    # F5: fallbacks the route's contract stopped, (endpoint id, clause); also in ``refused``.
    contract_refused: tuple[tuple[str, str], ...] = ()
    # F5: the route's contract and the first attempt's effective price and expected seconds
    # (a degrade's reference).
    contract: FallbackContract | None = None
    first_price: float = 0.0
    first_wait: float = 0.0
    # Every candidate is full past the request's deadline (``capacity``): nothing is planned;
    # (the endpoint with room first, seconds until then).
    capacity_refused: tuple[str, float] | None = None

    def contract_reference(self) -> ContractReference | None:
        """The reference a re-plan on another model keeps to (None: no contract to keep)."""
        if self.contract is None or self.contract.open or not self.attempts:
            return None
        return ContractReference(self.contract, self.attempts[0], self.first_price, self.first_wait)


TableLookup = Callable[[str, float], ModelTable | None]
# The default guards' baseline: price-only's shares, the TTFTs, the waits, their relative noise.
Baseline = tuple[list[float], list[float], list[float], list[float]]


def plan_build(
    request: RoutingRequest,
    table_for: TableLookup,
    *,
    now: float,
    rng: random.Random,
    default_strategy: str = "routing_cost",
    capacity: CapacityView | None = None,
    scarcity: ScarcityView | None = None,
) -> Plan:
    """Plan a request over its model and fallback models (provider fallback first, G13/G14).

    ``capacity``: what admission last heard of each endpoint's room; the routing-cost
    strategy adds its expected wait to the cost and leaves out endpoints full past the
    request's deadline (``routing.core.capacity``). ``scarcity``: the broker's grants and
    refusals per pool; the routing-cost strategy adds the shadow price of what the request
    would take there and leaves out endpoints where it displaces more than one request
    (``routing.core.scarcity``)."""
    prefs = request.provider
    slugs = [request.model, *(m for m in request.models if m != request.model)]
    if len(slugs) > 1 and prefs.sort_partition == "none" and not prefs.order:
        return _plan_unpartitioned(request, slugs, table_for, now=now, rng=rng)
    attempts: list[EndpointConfig] = []
    costs: list[float] = []
    refused: list[tuple[str, str]] = []
    demoted: list[tuple[str, str]] = []
    capped: list[str] = []
    terms: list[tuple[float, float]] = []
    first: _ModelPart | None = None
    contract: FallbackContract | None = None
    strategy = default_strategy
    full: tuple[str, float] | None = None
    for n, slug in enumerate(slugs):
        base, suffix_sort = model_suffix_split(slug)
        table = table_for(base, now)
        if table is None:
            refused.append((slug, "unknown_model"))
            continue
        model_strategy = strategy_choose(prefs, suffix_sort, request.tenant_sort, default_strategy)
        part = _model_part(
            table,
            request,
            model_strategy,
            now,
            rng,
            sticky_allowed=n == 0,
            capacity=capacity,
            scarcity=scarcity,
        )
        if part.capacity_refused is not None and (
            full is None or part.capacity_refused[1] < full[1]
        ):
            full = part.capacity_refused
        if first is None:
            first, strategy = part, model_strategy
            contract = contract_narrow(table.model.contract, request.contract)
        attempts.extend(table.endpoints[i] for i in part.order)
        costs.extend(part.costs[i] for i in part.order)
        if request.contract_reference is not None or (contract is not None and not contract.open):
            terms.extend(_terms(table, i, part) for i in part.order)  # only a contract reads them
        refused.extend(part.refused)
        demoted.extend(part.demoted)
        capped.extend(part.capped)
    held = (
        _contract_hold(contract, attempts, costs, terms, request.contract_reference)
        if terms
        else []
    )
    refused.extend((who, f"contract({clause})") for who, clause in held)
    return Plan(
        attempts=tuple(attempts),
        costs=tuple(costs),
        strategy=strategy,
        contract_refused=tuple(held),
        contract=_route_contract(contract, request),
        first_price=terms[0][0] if terms else 0.0,
        first_wait=terms[0][1] if terms else 0.0,
        sticky=first.sticky if first else False,
        sticky_reason=first.sticky_reason if first else "",
        refused=tuple(refused),
        demoted=tuple(demoted),
        input_tokens=first.input_tokens if first else 0.0,
        output_tokens=first.output_tokens if first else 0.0,
        capped=tuple(capped),
        cost_guard=first.cost_guard if first else None,
        speed_guard=first.speed_guard if first else False,
        capacity_refused=full if not attempts else None,
    )


def _terms(table: ModelTable, i: int, part: _ModelPart) -> tuple[float, float]:
    """The request's effective price (G3) and expected seconds (G4) at endpoint i: what a
    contract's price and latency ceilings read."""
    per_in, per_out = table.price_per_token(i)
    price = per_in * part.input_tokens + per_out * part.output_tokens
    return price, wait_seconds(table.estimates[i], part.output_tokens)


def _route_contract(
    contract: FallbackContract | None, request: RoutingRequest
) -> FallbackContract | None:
    reference = request.contract_reference
    return reference.contract if reference is not None else contract


def _contract_hold(
    contract: FallbackContract | None,
    attempts: list[EndpointConfig],
    costs: list[float],
    terms: list[tuple[float, float]],
    reference: ContractReference | None = None,
) -> list[tuple[str, str]]:
    """F5: drop (in place) every fallback the route's contract does not allow; returns each
    dropped endpoint with the clause that stopped it. The first choice is the contract's
    reference, never dropped itself — unless the reference is another plan's first choice
    (a degraded request), when every attempt here is a fallback."""
    if reference is not None:
        contract, start = reference.contract, 0
        first, first_price, first_wait = (
            reference.first,
            reference.first_price,
            reference.first_wait,
        )
    elif contract is None or contract.open or len(attempts) < 2:
        return []
    else:
        start, first, (first_price, first_wait) = 1, attempts[0], terms[0]
    held: list[tuple[str, str]] = []
    keep = list(range(start))
    for k in range(start, len(attempts)):
        price, wait = terms[k]
        clause = contract_breach(
            contract, first, first_price, attempts[k], price,
            first_wait=first_wait, candidate_wait=wait,
        )  # fmt: skip
        if clause is None:
            keep.append(k)
        else:
            held.append((attempts[k].id, clause))
    if held:
        attempts[:] = [attempts[k] for k in keep]
        costs[:] = [costs[k] for k in keep]
        terms[:] = [terms[k] for k in keep]
    return held


class _ModelPart:
    __slots__ = (
        "capacity_refused",
        "capped",
        "cost_guard",
        "costs",
        "demoted",
        "input_tokens",
        "order",
        "output_tokens",
        "plain_sticky",
        "refused",
        "speed_guard",
        "sticky",
        "sticky_reason",
    )

    def __init__(self) -> None:
        self.order: list[int] = []  # indices into table.endpoints
        self.costs: dict[int, float] = {}
        self.refused: list[tuple[str, str]] = []
        self.demoted: list[tuple[str, str]] = []
        self.capped: list[str] = []
        self.cost_guard: tuple[float, float] | None = None
        self.speed_guard = False
        self.plain_sticky = False  # G12's plain rule: stay while warm (the default guards)
        self.capacity_refused: tuple[str, float] | None = None
        self.sticky = False
        self.sticky_reason = ""
        self.input_tokens = 0.0
        self.output_tokens = 0.0


def _model_part(
    table: ModelTable,
    request: RoutingRequest,
    strategy: str,
    now: float,
    rng: random.Random,
    *,
    sticky_allowed: bool,
    capacity: CapacityView | None = None,
    scarcity: ScarcityView | None = None,
) -> _ModelPart:
    part = _ModelPart()
    checked = bool(request.features & CHECKED_FEATURES)
    if not checked:
        table = table.plain  # a quality flag demotes only where output is checked (G8)
    figures = table.figures
    assert figures is not None
    tokens_in = request.input_tokens if request.input_tokens is not None else figures.input_tokens
    tokens_out = (
        request.output_tokens if request.output_tokens is not None else figures.output_tokens
    )
    if request.max_tokens is not None and tokens_out > request.max_tokens:
        tokens_out = float(request.max_tokens)
    # An answer has at least one token, except embeddings' (max_tokens 0): no output terms.
    tokens_out = 0.0 if request.max_tokens == 0 else max(tokens_out, 1.0)
    part.input_tokens, part.output_tokens = tokens_in, tokens_out
    part.refused.extend(table.refused)
    prefs = request.provider
    cand = candidates(
        table,
        prefs,
        request.features,
        tokens_in,
        request.max_tokens,
        part.refused,
        plain=prefs is NO_PREFERENCES,
    )
    if not cand:
        return part
    inv = table.inv_checked if checked else table.inv_plain
    ci, co, cc = table.coef_in, table.coef_out, table.coef_const
    costs = [(ci[i] * tokens_in + co[i] * tokens_out + cc[i]) * inv[i] for i in cand]
    waiting: dict[int, float] = {}  # candidate → its wait for capacity, where it has one
    if strategy == "routing_cost" and capacity is not None and capacity.free_at:
        cand, costs = _capacity(
            table, cand, costs, request, tokens_in, capacity, now, part, waiting
        )
        if not cand:
            return part
    if strategy == "routing_cost" and scarcity is not None and scarcity.active:
        cand, costs = _scarcity(table, cand, costs, tokens_in, tokens_out, scarcity, now, part)
    part.costs = dict(zip(cand, costs, strict=True))
    if strategy == "routing_cost":
        # The cost guard's prices: this request's effective price per good answer (G3, G7/G8).
        po = table.price_out
        prices = [(ci[i] * tokens_in + po[i] * tokens_out) * inv[i] for i in cand]
        premium = prefs.max_cost_premium
        if premium is None:
            premium = table.model.max_cost_premium
        # A stated bound is the user's own trade of money for speed, kept as stated; with none,
        # the default also keeps the router no slower than price-only (guards.speed_guard).
        stated = premium is not None
        if premium is None:
            premium = DEFAULT_MAX_COST_PREMIUM
        full = _full(table, cand, waiting, scarcity, now)
        baseline = None if stated else _price_only_baseline(table, cand, tokens_out)
        # Under the default guards a conversation also sticks as under price-only (G12's plain
        # rule, while warm): the cost-gap move let conversations leave every endpoint dearer
        # than the best and join none, so the mix served drifted from the guarded shares
        # toward the cheapest (market (f): the shares gave beta 20 % of first picks, and it
        # served 10 % of the answers).
        part.plain_sticky = not stated
        order, capped = _routing_cost_order(
            table, cand, costs, prices, premium, rng, part, full, baseline
        )
        part.capped.extend(table.endpoints[i].id for i in capped)
        # A demoted endpoint goes first only as a probe (its probe share); as a fallback it
        # comes after every healthy endpoint ("planned, but last").
        order = order[:1] + sorted(order[1:], key=lambda i: table.demoted[i] != "")
    elif strategy == "price_only":
        prices = [table.endpoints[i].price_input for i in cand]
        outage = [table.legacy_outage[i] for i in cand]
        order = [cand[k] for k in price_only_order(prices, outage, rng)]
    elif strategy == "order":
        order = _client_order(table, cand, prefs, tokens_in, tokens_out, part.refused)
    else:
        order = _sorted(table, cand, strategy, tokens_in, tokens_out)
    if sticky_allowed and request.sticky is not None and strategy in ("routing_cost", "price_only"):
        order = _stick(table, request.sticky, order, part, now, rng, strategy)
    if strategy != "price_only":  # the old router knows no breaker or quality flag
        for i in order:
            if table.demoted[i]:
                part.demoted.append((table.endpoints[i].id, table.demoted[i]))
    if prefs.preferred_min_throughput is not None or prefs.preferred_max_latency is not None:
        order = _deprioritise(table, order, prefs, tokens_out, part.demoted, part.sticky)
    if not prefs.allow_fallbacks and strategy != "order":
        order = order[:1]
    part.order = order
    return part


def _capacity(
    table: ModelTable,
    cand: list[int],
    costs: list[float],
    request: RoutingRequest,
    tokens_in: float,
    capacity: CapacityView,
    now: float,
    part: _ModelPart,
    waiting: dict[int, float],
) -> tuple[list[int], list[float]]:
    """The candidates' routing costs with their expected wait for capacity, without those
    full past the deadline (all of them: ``part.capacity_refused``), ``routing.core.capacity``;
    each candidate's wait above 0 goes into ``waiting``."""
    ids = [table.endpoints[i].id for i in cand]
    waits = [capacity.wait(e, now, tokens_in) for e in ids]
    if not any(waits):
        return cand, costs
    waiting.update((i, w) for i, w in zip(cand, waits, strict=True) if w > 0.0)
    costs = capacity_costs(costs, waits, table.lam)
    deadline_s = request.deadline_s
    if deadline_s is None:
        return cand, costs
    keep, refused = capacity_refusal(ids, waits, deadline_s)
    if len(keep) < len(cand):
        kept = set(keep)
        part.refused.extend((ids[k], "capacity_wait") for k in range(len(ids)) if k not in kept)
    part.capacity_refused = refused
    return [cand[k] for k in keep], [costs[k] for k in keep]


def _scarcity(
    table: ModelTable,
    cand: list[int],
    costs: list[float],
    tokens_in: float,
    tokens_out: float,
    scarcity: ScarcityView,
    now: float,
    part: _ModelPart,
) -> tuple[list[int], list[float]]:
    """The candidates' routing costs with the shadow price of what the request takes of
    their pools, without those where it displaces more than one request (but never all),
    ``routing.core.scarcity``."""
    displaced = [
        scarcity.displaced(
            table.endpoints[i].id,
            now,
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            price=request_price(table, i, tokens_in, tokens_out),
            seconds=wait_seconds(table.estimates[i], tokens_out),
        )
        for i in cand
    ]
    if not any(displaced):
        return cand, costs
    priced, keep = scarcity_costs(costs, displaced)
    if len(keep) < len(cand):
        kept = set(keep)
        part.refused.extend(
            (table.endpoints[cand[k]].id, "scarce") for k in range(len(cand)) if k not in kept
        )
    return [cand[k] for k in keep], [priced[k] for k in keep]


def request_price(table: ModelTable, i: int, tokens_in: float, tokens_out: float) -> float:
    """G3: the request's effective price at endpoint i (what a spend bucket is charged)."""
    per_in, per_out = table.price_per_token(i)
    return per_in * tokens_in + per_out * tokens_out


def _price_only_baseline(table: ModelTable, cand: list[int], tokens_out: float) -> Baseline:
    """The default guards' baseline: the price-only router's shares over the candidates
    (``legacy``), each candidate's TTFT, its wait as the routing cost prices it (G4, G5),
    w_e = (1 + ttft_weight)·ttft_e + O/tps_e seconds, and how far those may be off."""
    wc, wp = table.wait_const, table.wait_per_token
    if len(cand) == len(table.endpoints):  # the common case: the table's own lists
        waits = [c + tokens_out * w for c, w in zip(wc, wp, strict=True)]
        return table.legacy_shares, table.ttft, waits, table.speed_noise
    shares = price_only_shares(
        [table.endpoints[i].price_input for i in cand], [table.legacy_outage[i] for i in cand]
    )
    return (
        shares,
        [table.ttft[i] for i in cand],
        [wc[i] + tokens_out * wp[i] for i in cand],
        [table.speed_noise[i] for i in cand],
    )


def _full(
    table: ModelTable,
    cand: list[int],
    waiting: dict[int, float],
    scarcity: ScarcityView | None,
    now: float,
) -> list[bool] | None:
    """Which candidates can take no more traffic, for the cost guard (None: none can be said
    to). With κ_e the learned cap and r_e the attempt rate (G10), w_e the broker's expected
    wait for this request (``waiting``, as ``_capacity`` read it) and ρ_e the share of the
    broker's recent fast tries at e it refused (``scarcity``, a concurrency limit too):

        full_e = (κ_e > 0 and r_e ≥ cap_saturation·κ_e) or w_e > 0 or ρ_e ≥ cap_trigger_rate

    the cap's own "near the cap" and the share of refusals at which 429s cut a cap: no new knob.
    """
    p = table.params
    out: list[bool] | None = None
    for k, i in enumerate(cand):
        est = table.estimates[i]
        full = est.cap_rps > 0.0 and est.attempt_rate >= p.cap_saturation * est.cap_rps
        if not full:
            full = i in waiting
        if not full and scarcity is not None and scarcity.active:
            full = scarcity.refused_share(table.endpoints[i].id, now) >= p.cap_trigger_rate
        if full:
            if out is None:
                out = [False] * len(cand)
            out[k] = True
    return out


def _routing_cost_order(
    table: ModelTable,
    cand: list[int],
    costs: list[float],
    prices: list[float],
    max_premium: float,
    rng: random.Random,
    part: _ModelPart,
    full: list[bool] | None = None,
    baseline: Baseline | None = None,
) -> tuple[list[int], list[int]]:
    """The order drawn from the shares and the endpoints held at their cap bound; on ``part``
    the cost guard's (premium before, after) when it moved share, and whether the speed guard
    did (``baseline``: price-only's shares, the TTFTs, the waits and their noise; None: a
    stated bound).

    Held at the cap: by the band's own shares, before the guard. Share the guard moves to a
    cheap endpoint is the user's bound, not demand the router's ranking had for it; counted as
    held back, it made the cap grow (G10: it grows while it holds demand back and 429s are
    rare) whenever the guard filled the endpoint, which says nothing of what it can serve.
    (It was not the only growth: on market (b), where the broker's learned concurrency, not a
    429, refuses gamma's excess, gamma's cap still climbed from 1.5 to 4.6 attempts/s while
    gamma served 1, by running near it; hence ``_full`` reads the broker too.)
    """
    if len(cand) == len(table.endpoints):
        mult, lower, upper = table.multiplier, table.lower, table.upper
    else:
        mult = [table.multiplier[i] for i in cand]
        lower = [table.lower[i] for i in cand]
        upper = [table.upper[i] for i in cand]
    shares = fill(band_weights(costs, mult, table.params), lower, upper)
    capped = [
        cand[k]
        for k, (x, lo, hi) in enumerate(zip(shares, lower, upper, strict=True))
        if lo < hi < 1.0 and x >= hi * (1.0 - 1e-9)
    ]
    sped, base_price = False, 0.0
    if baseline is not None:
        # No slower than price-only's mix in time to first token, then in the whole wait.
        x, ttfts, waits, noise = baseline
        z = table.params.speed_guard_z
        shares, sped = speed_guard(shares, ttfts, lower, upper, x, noise, z, full)
        shares, sped_wait = speed_guard(shares, waits, lower, upper, x, noise, z, full)
        sped = sped or sped_wait
        base_price = mix_mean(x, prices)
    shares, before, after = cost_guard(shares, prices, lower, upper, max_premium, full, base_price)
    part.cost_guard = (before, after) if after < before else None
    part.speed_guard = sped
    return [cand[k] for k in weighted_order(shares, rng)], capped


def _sort_key(
    table: ModelTable, i: int, strategy: str, tokens_in: float, tokens_out: float
) -> float:
    if strategy == "price":  # effective price (G3), not the listed one
        per_in, per_out = table.price_per_token(i)
        return per_in * tokens_in + per_out * tokens_out
    if strategy == "throughput":
        return -table.e2e_tokens_per_s(i, tokens_out)
    if strategy == "latency":
        return table.estimates[i].ttft_s
    raise ValueError(f"unknown routing strategy {strategy!r}")


def _sorted(
    table: ModelTable, cand: list[int], strategy: str, tokens_in: float, tokens_out: float
) -> list[int]:
    # Endpoints behind a breaker or quality flag go last even under an explicit sort.
    return sorted(
        cand,
        key=lambda i: (
            table.demoted[i] != "",
            _sort_key(table, i, strategy, tokens_in, tokens_out),
        ),
    )


def _client_order(
    table: ModelTable,
    cand: list[int],
    prefs: ProviderPreferences,
    tokens_in: float,
    tokens_out: float,
    refused: list[tuple[str, str]],
) -> list[int]:
    allowed = set(cand)
    listed: list[int] = []
    for slug in prefs.order:
        i = table.index.get(slug)
        if i is not None and i in allowed and i not in listed:
            listed.append(i)
    rest = [i for i in cand if i not in listed]
    if not prefs.allow_fallbacks:
        refused.extend((table.endpoints[i].id, "not_in_order") for i in rest)
        return listed
    # After the client's order, the rest go by price, as before the routing-cost router.
    return listed + _sorted(table, rest, "price", tokens_in, tokens_out)


def _stick(
    table: ModelTable,
    state: StickyState,
    order: list[int],
    part: _ModelPart,
    now: float,
    rng: random.Random,
    strategy: str,
) -> list[int]:
    i = table.index.get(state.endpoint_id)
    if i is None or i not in part.costs or table.endpoints[i].id != state.endpoint_id:
        part.sticky_reason = "unavailable"
        return order
    legacy = strategy == "price_only"
    available = not (table.legacy_outage[i] if legacy else table.demoted[i])
    keep = 1.0
    if not legacy:
        est = table.estimates[i]
        keep = table.multiplier[i]
        if est.cap_rps > 0.0 and est.attempt_rate > est.cap_rps:
            keep *= est.cap_rps / est.attempt_rate
    healthy = [c for j, c in part.costs.items() if not table.demoted[j]]
    stay, reason = sticky_decide(
        state,
        table.endpoints[i],
        now=now,
        available=available,
        keep_probability=keep,
        pinned_cost=part.costs[i],
        best_cost=min(healthy) if healthy else part.costs[i],
        hit_probability=table.params.sticky_hit_probability,
        rng=rng,
        compare_cost=not (legacy or part.plain_sticky),
    )
    part.sticky, part.sticky_reason = stay, reason
    if not stay:
        return order
    return [i, *(j for j in order if j != i)]


def _deprioritise(
    table: ModelTable,
    order: list[int],
    prefs: ProviderPreferences,
    tokens_out: float,
    demoted: list[tuple[str, str]],
    keep_first: bool,
) -> list[int]:
    preferred, behind = [], []
    for pos, i in enumerate(order):
        slow = (
            prefs.preferred_min_throughput is not None
            and table.e2e_tokens_per_s(i, tokens_out) < prefs.preferred_min_throughput
        )
        late = (
            prefs.preferred_max_latency is not None
            and table.estimates[i].ttft_s > prefs.preferred_max_latency
        )
        if (slow or late) and not (keep_first and pos == 0):
            behind.append(i)
            demoted.append(
                (table.endpoints[i].id, "below_min_throughput" if slow else "above_max_latency")
            )
        else:
            preferred.append(i)
    return preferred + behind


def _plan_unpartitioned(
    request: RoutingRequest,
    slugs: list[str],
    table_for: TableLookup,
    *,
    now: float,
    rng: random.Random,
) -> Plan:
    # sort.partition "none": the endpoints of all listed models are sorted together.
    prefs = request.provider
    sort = prefs.sort or "price"
    keyed: list[tuple[bool, float, int, EndpointConfig, float, tuple[float, float]]] = []
    refused: list[tuple[str, str]] = []
    first: _ModelPart | None = None
    contract: FallbackContract | None = None
    for n, slug in enumerate(slugs):
        base, _ = model_suffix_split(slug)
        table = table_for(base, now)
        if table is None:
            refused.append((slug, "unknown_model"))
            continue
        part = _model_part(table, request, sort, now, rng, sticky_allowed=False)
        if not request.features & CHECKED_FEATURES:
            table = table.plain  # as _model_part ranked it
        if first is None:
            first = part
            contract = contract_narrow(table.model.contract, request.contract)
        refused.extend(part.refused)
        for i in part.order:
            key = _sort_key(table, i, sort, part.input_tokens, part.output_tokens)
            keyed.append(
                (
                    table.demoted[i] != "",
                    key,
                    n,
                    table.endpoints[i],
                    part.costs[i],
                    _terms(table, i, part),
                )
            )
    keyed.sort(key=lambda k: (k[0], k[1], k[2]))
    if not prefs.allow_fallbacks:
        keyed = keyed[:1]
    attempts, costs = [k[3] for k in keyed], [k[4] for k in keyed]
    terms = [k[5] for k in keyed]
    held = _contract_hold(contract, attempts, costs, terms, request.contract_reference)
    refused.extend((who, f"contract({clause})") for who, clause in held)
    return Plan(
        attempts=tuple(attempts),
        costs=tuple(costs),
        strategy=sort,
        refused=tuple(refused),
        contract_refused=tuple(held),
        contract=_route_contract(contract, request),
        first_price=terms[0][0] if terms else 0.0,
        first_wait=terms[0][1] if terms else 0.0,
        input_tokens=first.input_tokens if first else 0.0,
        output_tokens=first.output_tokens if first else 0.0,
    )


def plan_explanation(plan: Plan) -> str:
    """G15 header value: strategy, winner and runner-up cost, sticky, refused candidates."""
    parts = [f"strategy={plan.strategy}"]
    if plan.attempts:
        parts.append(f"winner={plan.attempts[0].provider} cost={plan.costs[0]:.6g}")
    if len(plan.attempts) > 1:
        parts.append(f"runner_up={plan.attempts[1].provider} cost={plan.costs[1]:.6g}")
    parts.append(f"sticky={'yes' if plan.sticky else 'no'}")
    if plan.sticky_reason:
        parts[-1] += f"({plan.sticky_reason})"
    if plan.cost_guard is not None:
        before, after = plan.cost_guard
        parts.append(f"cost_guard=bound({before:+.1%}->{after:+.1%})")  # headers are ASCII
    if plan.speed_guard:
        parts.append("speed_guard=price_only")
    if plan.capacity_refused is not None:
        who, wait = plan.capacity_refused
        parts.append(f"capacity_wait={who}:{wait:.3g}s")
    excluded = [*plan.refused, *plan.demoted]
    if excluded:
        parts.append("refused=" + ",".join(f"{who}:{why}" for who, why in excluded))
    return "; ".join(parts)
