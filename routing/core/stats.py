"""Live endpoint statistics (SPEC G2–G10) as small flat dicts of exponentially decayed sums.

An endpoint's state is a ``dict[str, float]``: one time ``t`` plus decayed sums, each group with
its own half-life. A sample of weight w taken at time s contributes w·2^(−(now − s)/H) at time
``now``, so irregular sample times need nothing special, and two states (two gateway processes,
or a process and its Redis mirror) merge by decaying both to the later ``t`` and adding. Means
are ratios of sums; priors are added only when reading (``endpoint_estimate``), so a merge never
counts a prior twice and a new endpoint is simply an empty dict.

Keys (S = sum, all decayed; groups by half-life):
    fast (fast_half_life_s):      n attempts, rl 429s, flt provider faults, rlt Σ seconds to a 429
    backoff (backoff_half_life_s): bn attempts, bf faults + 429s, brl 429s,
                                  bcp plans whose share the cap held down (demand it refused)
    speed (speed_half_life_s):    ok timed answers, ttft Σ TTFT, gen Σ streaming seconds,
                                  out Σ output tokens of timed answers,
                                  in / cin Σ input / cached input tokens (token-weighted hit rate)
    quality (quality_half_life_s): chk checked outputs, bad malformed ones
    not decayed:                   t0 first observation (min on merge, for the attempt rate),
                                   cap learned capacity in attempts/s (0: none yet),
                                   capt when cap growth was last accrued, caps when it was last cut
A model's traffic state (traffic_half_life_s): t, req answers, in, out tokens (G2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

from routing.core.parameters import RoutingParameters

OutcomeKind = Literal["ok", "rate_limited", "fault", "ignored"]
State = dict[str, float]

LN2 = math.log(2.0)
FAST = ("n", "rl", "flt", "rlt")
BACKOFF = ("bn", "bf", "brl", "bcp")
SPEED = ("ok", "ttft", "gen", "out", "in", "cin")
QUALITY = ("chk", "bad")
TRAFFIC = ("req", "in", "out")
LAST_WRITER = ("cap", "capt", "caps")
MIN_RATE_SPAN_S = 1.0  # a rate is never read off less than a second of observation


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one attempt on an endpoint showed.

    kind: ``ok``; ``rate_limited`` (429 capacity or policy refusal); ``fault`` (the provider's
    fault: 5xx, 503/529 overload, timeout, bad credential); ``ignored`` (the caller's fault or a
    cancellation: says nothing about the endpoint). latency_s: to the end of the answer, or to
    the refusal for a 429. ttft_s: None when not streamed (the latency is then split by the
    endpoint's own TTFT/streaming ratio). output_checked/output_bad: the output had tool calls
    or a response_format to validate, and it was malformed (G8).
    """

    kind: OutcomeKind
    latency_s: float = 0.0
    ttft_s: float | None = None
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    output_checked: bool = False
    output_bad: bool = False


class EndpointEstimate(NamedTuple):
    """An endpoint's figures at one time, priors included."""

    ttft_s: float
    tokens_per_s: float  # streaming speed: output tokens / (latency − TTFT)
    cache_hit_rate: float  # token-weighted
    fault_rate: float  # provider faults / answered attempts
    rate_limited_rate: float  # 429s / attempts
    bad_output_rate: float  # malformed / checked outputs
    rate_limit_wait_s: float  # seconds until a 429 arrives
    backoff_failure_rate: float  # (faults + 429s) / attempts over the short backoff window
    attempt_rate: float  # attempts per second (arrival rate, for the cap)
    cap_rps: float  # learned capacity, attempts per second; 0 = none learned
    speed_samples: float = 0.0  # answers TTFT and speed rest on (decayed, priors included)


class ModelFigures(NamedTuple):
    """The model's typical figures: priors of its endpoints and its request shape (G2, G10)."""

    ttft_s: float
    tokens_per_s: float
    cache_hit_rate: float
    fault_rate: float
    rate_limited_rate: float
    bad_output_rate: float
    rate_limit_wait_s: float
    input_tokens: float
    output_tokens: float

    @property
    def output_per_input(self) -> float:
        """The model's output/input token ratio over recent traffic (token-weighted)."""
        return self.output_tokens / self.input_tokens if self.input_tokens > 0 else 0.0


def decay_factor(dt: float, half_life: float) -> float:
    """2^(−dt/half_life): what a sample of age ``dt`` still weighs (1 for dt ≤ 0)."""
    return math.exp(-dt * LN2 / half_life) if dt > 0.0 else 1.0


def _scale(state: State, keys: tuple[str, ...], factor: float) -> None:
    for key in keys:
        if key in state:
            state[key] *= factor


def endpoint_decay(state: State, now: float, params: RoutingParameters) -> None:
    """Decay every group of ``state`` in place to ``now`` (no-op for an earlier ``now``)."""
    dt = now - state.get("t", now)
    if dt > 0.0:
        _scale(state, FAST, decay_factor(dt, params.fast_half_life_s))
        _scale(state, BACKOFF, decay_factor(dt, params.backoff_half_life_s))
        _scale(state, SPEED, decay_factor(dt, params.speed_half_life_s))
        _scale(state, QUALITY, decay_factor(dt, params.quality_half_life_s))
    if dt > 0.0 or "t" not in state:
        state["t"] = now


def _add(state: State, key: str, value: float) -> None:
    state[key] = state.get(key, 0.0) + value


def attempt_rate(state: State, params: RoutingParameters, now: float | None = None) -> float:
    """Attempts per second at ``now`` (default: the state's time).

    A Poisson stream of rate ρ observed since t0 keeps E[n] = ρ·(H/ln2)·(1 − 2^(−(now − t0)/H)),
    so dividing by that span weight gives an unbiased rate from the very first seconds (a plain
    n·ln2/H would read a new endpoint's load as far too low and set its cap there).
    """
    t = state.get("t", 0.0)
    now = t if now is None else max(now, t)
    half_life = params.fast_half_life_s
    span = max(now - state.get("t0", t), MIN_RATE_SPAN_S)
    weight = (1.0 - decay_factor(span, half_life)) * half_life / LN2
    return state.get("n", 0.0) * decay_factor(now - t, half_life) / weight


def endpoint_observe(state: State, outcome: Outcome, now: float, params: RoutingParameters) -> None:
    """Add one attempt's outcome to ``state`` in place; also runs the cap's learning (G10)."""
    if outcome.kind == "ignored":
        return
    t = state.get("t", now)
    if "t0" not in state or now < state["t0"]:
        state["t0"] = now
    if now >= t:
        endpoint_decay(state, now, params)
        w_fast = w_bo = w_speed = w_q = 1.0
    else:  # a late sample (another process, a slow answer): it counts as already decayed
        age = t - now
        w_fast = decay_factor(age, params.fast_half_life_s)
        w_bo = decay_factor(age, params.backoff_half_life_s)
        w_speed = decay_factor(age, params.speed_half_life_s)
        w_q = decay_factor(age, params.quality_half_life_s)
        now = t
    _add(state, "n", w_fast)
    _add(state, "bn", w_bo)
    kind = outcome.kind
    if kind == "rate_limited":
        _add(state, "rl", w_fast)
        _add(state, "rlt", w_fast * outcome.latency_s)
        _add(state, "bf", w_bo)
        _add(state, "brl", w_bo)
        _cap_on_rate_limit(state, now, params)
        return
    if kind == "fault":
        _add(state, "flt", w_fast)
        _add(state, "bf", w_bo)
    else:
        _observe_answer(state, outcome, w_speed, w_q)
    _cap_on_answer(state, now, params)


def _observe_answer(state: State, outcome: Outcome, w_speed: float, w_q: float) -> None:
    if outcome.input_tokens > 0:
        _add(state, "in", w_speed * outcome.input_tokens)
        _add(state, "cin", w_speed * min(outcome.cached_input_tokens, outcome.input_tokens))
    if outcome.output_checked:
        _add(state, "chk", w_q)
        if outcome.output_bad:
            _add(state, "bad", w_q)
    latency = outcome.latency_s
    if latency <= 0.0:
        return
    ttft = outcome.ttft_s
    if ttft is None:  # not streamed: split like this endpoint's own answers
        seen_ttft, seen_gen = state.get("ttft", 0.0), state.get("gen", 0.0)
        if seen_ttft + seen_gen <= 0.0:
            return
        ttft = latency * seen_ttft / (seen_ttft + seen_gen)
    ttft = min(max(ttft, 0.0), latency)
    _add(state, "ok", w_speed)
    _add(state, "ttft", w_speed * ttft)
    if outcome.output_tokens > 0:
        _add(state, "gen", w_speed * (latency - ttft))
        _add(state, "out", w_speed * outcome.output_tokens)


def recent_rate_limited(state: State) -> float:
    """Fraction of attempts refused with 429 over the short backoff window."""
    attempts = state.get("bn", 0.0)
    return state.get("brl", 0.0) / attempts if attempts > 0.0 else 0.0


def _cap_on_rate_limit(state: State, now: float, params: RoutingParameters) -> None:
    # "Big spike: cap set; steady 429s: cap holds". A stray 429 says little: the cap is cut only
    # when 429s are a real share of recent attempts, at most once per hold period, and to a
    # fraction of the load the endpoint *accepted* then — its capacity, as far as we can see.
    refused = recent_rate_limited(state)
    if state.get("brl", 0.0) < 2.0 or refused < params.cap_trigger_rate:
        return
    if now - state.get("caps", -math.inf) < params.cap_hold_s:
        return
    accepted = attempt_rate(state, params) * (1.0 - refused)
    proposal = max(params.cap_min_rps, params.cap_decrease * accepted)
    cap = state.get("cap", 0.0)
    if cap <= 0.0 or proposal < cap:
        state["cap"] = proposal
        state["caps"] = now
    state["capt"] = now


def endpoint_capped(state: State, now: float, params: RoutingParameters) -> None:
    """A plan's share of this endpoint was held at its cap bound (G10): the cap refused demand."""
    if now >= state.get("t", now):
        endpoint_decay(state, now, params)
        _add(state, "bcp", 1.0)
    else:  # a late note counts as already decayed, like a late sample
        _add(state, "bcp", decay_factor(state["t"] - now, params.backoff_half_life_s))


def _cap_on_answer(state: State, now: float, params: RoutingParameters) -> None:
    # "No 429s under load: cap rises" — growth accrues only over time the cap binds while 429s
    # are rare, so a provider that adds capacity gets more traffic by itself. It binds when the
    # endpoint runs near it, or when it holds plans back: the bound is on each request's share,
    # so when only some requests want the endpoint (long prompts, say) it holds them back while
    # the endpoint's total load stays well below the cap.
    cap = state.get("cap", 0.0)
    if cap <= 0.0:
        return
    since = now - state.get("capt", now)
    if (
        since > 0.0
        and recent_rate_limited(state) < params.cap_quiet_rate
        and (
            attempt_rate(state, params) >= params.cap_saturation * cap
            or state.get("bcp", 0.0) >= 1.0
        )
    ):
        state["cap"] = cap * (1.0 + params.cap_growth_per_min) ** (since / 60.0)
    state["capt"] = max(now, state.get("capt", now))


def stats_merge(a: State, b: State, params: RoutingParameters) -> State:
    """Merge two endpoint states (decay both to the later time, add; cap: latest writer wins)."""
    t = max(a.get("t", -math.inf), b.get("t", -math.inf))
    if t == -math.inf:
        return {}
    left, right = dict(a), dict(b)
    endpoint_decay(left, t, params)
    endpoint_decay(right, t, params)
    merged: State = {"t": t}
    for key in (*FAST, *BACKOFF, *SPEED, *QUALITY):
        if key in left or key in right:
            merged[key] = left.get(key, 0.0) + right.get(key, 0.0)
    newer = left if left.get("capt", -math.inf) >= right.get("capt", -math.inf) else right
    for key in LAST_WRITER:
        if key in newer:
            merged[key] = newer[key]
    if "t0" in left or "t0" in right:
        merged["t0"] = min(left.get("t0", math.inf), right.get("t0", math.inf))
    return merged


def traffic_merge(a: State, b: State, params: RoutingParameters) -> State:
    """Merge two model traffic states (decay both to the later time, add)."""
    t = max(a.get("t", -math.inf), b.get("t", -math.inf))
    if t == -math.inf:
        return {}
    merged: State = {"t": t}
    for side in (a, b):
        factor = decay_factor(t - side.get("t", t), params.traffic_half_life_s)
        for key in TRAFFIC:
            if key in side:
                merged[key] = merged.get(key, 0.0) + side[key] * factor
    return merged


def traffic_observe(state: State, outcome: Outcome, now: float, params: RoutingParameters) -> None:
    """Add an answered request's size to the model's traffic state (G2)."""
    if outcome.kind != "ok" or outcome.input_tokens <= 0:
        return
    t = state.get("t", now)
    weight = 1.0
    if now >= t:
        _scale(state, TRAFFIC, decay_factor(now - t, params.traffic_half_life_s))
        state["t"] = now
    else:
        weight = decay_factor(t - now, params.traffic_half_life_s)
    _add(state, "req", weight)
    _add(state, "in", weight * outcome.input_tokens)
    _add(state, "out", weight * outcome.output_tokens)


def median(values: list[float], default: float) -> float:
    """The median of ``values``, or ``default`` for none."""
    if not values:
        return default
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def lower_median(values: list[float], default: float) -> float:
    """The median, or of an even count the lower middle value: the healthier half's figure,
    which one failing endpoint of two cannot move (a mean of the two would be half its rate)."""
    if not values:
        return default
    return sorted(values)[(len(values) - 1) // 2]


def model_figures(
    states: list[State],
    traffic: State,
    now: float,
    params: RoutingParameters,
    *,
    default_input_tokens: float,
    default_output_tokens: float,
) -> ModelFigures:
    """The model's typical figures: medians over endpoints with data (the fault rate: the lower
    median of shrunk rates), else the defaults."""
    ttft, tps, hit, fault, limited, bad, wait = [], [], [], [], [], [], []
    p = params
    for state in states:
        d_fast = decay_factor(now - state.get("t", now), p.fast_half_life_s)
        d_speed = decay_factor(now - state.get("t", now), p.speed_half_life_s)
        d_q = decay_factor(now - state.get("t", now), p.quality_half_life_s)
        n, rl = state.get("n", 0.0) * d_fast, state.get("rl", 0.0) * d_fast
        if n >= 1.0:
            limited.append(rl / n)
            if n - rl >= 1.0:
                # Shrunk toward the default: a trickle (a floor's few attempts) with one fault
                # in it would otherwise read as 20 % or more and, as the model's figure, raise
                # every endpoint's prior and the breaker's threshold (G7) with it.
                w = p.prior_attempts
                flt = state.get("flt", 0.0) * d_fast
                fault.append((flt + w * p.default_fault_rate) / (n - rl + w))
        if rl >= 1.0:
            wait.append(state.get("rlt", 0.0) / state.get("rl", 1.0))
        if state.get("ok", 0.0) * d_speed >= 1.0:
            ttft.append(state.get("ttft", 0.0) / state["ok"])
        if state.get("gen", 0.0) > 0.0 and state.get("out", 0.0) * d_speed >= 1.0:
            tps.append(state["out"] / state["gen"])
        if state.get("in", 0.0) * d_speed >= 1.0:
            hit.append(state.get("cin", 0.0) / state["in"])
        if state.get("chk", 0.0) * d_q >= 1.0:
            bad.append(state.get("bad", 0.0) / state["chk"])
    d_traffic = decay_factor(now - traffic.get("t", now), p.traffic_half_life_s)
    req = traffic.get("req", 0.0) * d_traffic
    w0 = p.prior_answers
    typical_in = (traffic.get("in", 0.0) * d_traffic + w0 * default_input_tokens) / (req + w0)
    typical_out = (traffic.get("out", 0.0) * d_traffic + w0 * default_output_tokens) / (req + w0)
    return ModelFigures(
        ttft_s=median(ttft, p.default_ttft_s),
        tokens_per_s=median(tps, p.default_tokens_per_s),
        cache_hit_rate=median(hit, p.default_cache_hit_rate),
        fault_rate=lower_median(fault, p.default_fault_rate),
        rate_limited_rate=median(limited, p.default_rate_limited_rate),
        bad_output_rate=median(bad, p.default_bad_output_rate),
        rate_limit_wait_s=median(wait, p.default_rate_limit_wait_s),
        input_tokens=typical_in,
        output_tokens=max(1.0, typical_out),
    )


def endpoint_estimate(
    state: State, figures: ModelFigures, now: float, params: RoutingParameters
) -> EndpointEstimate:
    """The endpoint's figures at ``now``: its decayed sums plus the model's figures as priors."""
    p, f = params, figures
    dt = now - state.get("t", now)
    d_fast = decay_factor(dt, p.fast_half_life_s)
    d_bo = decay_factor(dt, p.backoff_half_life_s)
    d_speed = decay_factor(dt, p.speed_half_life_s)
    d_q = decay_factor(dt, p.quality_half_life_s)
    g = state.get
    n, rl = g("n", 0.0) * d_fast, g("rl", 0.0) * d_fast
    w0 = p.prior_attempts
    rate_limited = (rl + w0 * f.rate_limited_rate) / (n + w0)
    fault = (g("flt", 0.0) * d_fast + w0 * f.fault_rate) / (max(n - rl, 0.0) + w0)
    wait = (g("rlt", 0.0) * d_fast + 2.0 * f.rate_limit_wait_s) / (rl + 2.0)
    wa = p.prior_answers
    ttft = (g("ttft", 0.0) * d_speed + wa * f.ttft_s) / (g("ok", 0.0) * d_speed + wa)
    # Token-weighted sums get priors worth `wa` typical requests.
    prior_out = wa * f.output_tokens
    gen = g("gen", 0.0) * d_speed + prior_out / f.tokens_per_s
    tps = (g("out", 0.0) * d_speed + prior_out) / gen
    prior_in = wa * f.input_tokens
    hit = (g("cin", 0.0) * d_speed + prior_in * f.cache_hit_rate) / (
        g("in", 0.0) * d_speed + prior_in
    )
    wq = p.prior_checked
    bad = (g("bad", 0.0) * d_q + wq * f.bad_output_rate) / (g("chk", 0.0) * d_q + wq)
    wb = p.prior_backoff
    base = f.fault_rate + f.rate_limited_rate
    backoff = (g("bf", 0.0) * d_bo + wb * base) / (g("bn", 0.0) * d_bo + wb)
    return EndpointEstimate(
        ttft_s=ttft,
        tokens_per_s=tps,
        cache_hit_rate=hit,
        fault_rate=fault,
        rate_limited_rate=rate_limited,
        bad_output_rate=bad,
        rate_limit_wait_s=wait,
        backoff_failure_rate=backoff,
        attempt_rate=attempt_rate(state, p, now),
        cap_rps=g("cap", 0.0),
        speed_samples=g("ok", 0.0) * d_speed + wa,
    )
