"""Per-model routing parameters (SPEC G1–G14): every tunable of the routing cost and its guards.

All times are seconds, all prices USD, all rates fractions of attempts. The defaults are meant
for the general case (any model, any market), not for one market: they are stated relative to
the model's own figures (λ from its cheapest endpoint's price and the median speed, shares
relative to the cheapest routing cost), so they need no per-market tuning. Later editable in
the admin per model.
"""

from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("routing_cost", "price", "throughput", "latency", "price_only")


@dataclass(frozen=True, slots=True)
class RoutingParameters:
    """The knobs of one model's router; see the module and field comments for the formula."""

    # --- live statistics (decayed sums; the half-life is the sample's weight halving time) ---
    # 429s, provider faults and the arrival rate must react within seconds (G11).
    fast_half_life_s: float = 30.0
    # TTFT, streaming speed and cache-hit rate are noisy per request; minutes smooth them.
    speed_half_life_s: float = 300.0
    # Malformed output is rare: it needs many samples before it means anything.
    quality_half_life_s: float = 1800.0
    # The backoff window: a short memory so a burst of failures bites and then fades.
    backoff_half_life_s: float = 10.0
    # The model's request shape (G2): typical input/output tokens of recent traffic.
    traffic_half_life_s: float = 600.0

    # Pseudo-observations of the model's figures every endpoint starts with (G10: a new endpoint
    # needs no history; one odd sample cannot swing an estimate).
    prior_attempts: float = 20.0  # for the fault and 429 rates
    prior_answers: float = 3.0  # for TTFT, speed and cache-hit rate (token-weighted: × typical)
    prior_checked: float = 30.0  # for the bad-output rate
    prior_backoff: float = 4.0  # for the backoff failure fraction

    # Model figures used when no endpoint of the model has data yet.
    default_ttft_s: float = 1.0
    default_tokens_per_s: float = 50.0
    default_cache_hit_rate: float = 0.0
    default_fault_rate: float = 0.01
    default_rate_limited_rate: float = 0.01
    default_bad_output_rate: float = 0.01
    default_rate_limit_wait_s: float = 0.5  # time until a 429 arrives
    default_input_tokens: float = 1000.0

    # --- routing cost (G1–G8) ---
    # λ = time_value × min(effective price of a typical request) / median(its e2e time):
    # at 1.0 a typical request's waiting is worth what its cheapest endpoint charges for it.
    time_value: float = 1.0
    # μ = ttft_weight × λ: TTFT costs again on its own (G5), interactive and agent loops wait on it.
    ttft_weight: float = 1.0
    # G6: a 429 costs the wait for the refusal plus this penalty (the redo elsewhere), × λ.
    rate_limit_penalty_s: float = 2.0
    # Failure rates are clamped so a dead endpoint has a finite (huge) cost.
    max_failure_rate: float = 0.95

    # --- breaker (G7) and quality flag (G8) ---
    # Open when rate > breaker_ratio × peers' (lower) median + breaker_margin.
    breaker_ratio: float = 3.0
    breaker_margin: float = 0.05
    # Hysteresis: an open breaker closes only when the recent fault rate (backoff window),
    # weighed with this many pseudo-attempts of the model's rate (instead of prior_attempts),
    # is back under the threshold. Failing probes keep it open; without probes the evidence
    # fades and it retries after several backoff half-lives — not as soon as the evidence is
    # too thin to reopen it, nor, for a busy endpoint, only after the fast window forgets.
    breaker_hold_prior: float = 1.0
    # A breaker that reopens in its half-open spell fades that much slower the next time: the
    # hold's half-life doubles per consecutive trip, up to this factor (as Envoy's ejection time
    # grows with consecutive ejections). A long incident then meets fewer and fewer re-tests,
    # and an endpoint is still tried again within 5 minutes after it recovers (G11).
    breaker_trip_factor_max: float = 4.0
    quality_flag_ratio: float = 3.0
    quality_flag_margin: float = 0.05

    # --- shares (G9) ---
    band: float = 0.3  # γ: the competitive band, cost ≤ (1 + γ) × best cost
    beta: float = 0.12  # β: w = exp(−(cost/best − 1)/β) inside the band
    beta_outside: float = 0.02  # beyond the band the share falls with this (much smaller) scale

    # --- guards (G10) ---
    floor_share: float = 0.01  # trickle per eligible endpoint …
    floor_total: float = 0.08  # … but all floors together take at most this
    probe_share: float = 0.002  # breaker-open or flagged endpoints: test traffic only
    # Backoff multiplier = max(backoff_min, exp(−backoff_strength × excess)), excess = the
    # recent failure fraction (faults + 429s, backoff_half_life_s) above the model's usual
    # fault + 429 rate plus backoff_tolerance.
    backoff_strength: float = 6.0
    backoff_tolerance: float = 0.05
    backoff_min: float = 0.05
    # Cap (attempts/s): when 429s are ≥ cap_trigger_rate of recent attempts (backoff window),
    # the cap is cut to cap_decrease × the rate the endpoint accepted, at most once per
    # cap_hold_s. While the endpoint runs at ≥ cap_saturation × cap with 429s below
    # cap_quiet_rate, the cap grows by cap_growth_per_min (relative, compounded).
    cap_trigger_rate: float = 0.1
    cap_hold_s: float = 10.0
    cap_decrease: float = 0.9
    cap_saturation: float = 0.8
    cap_quiet_rate: float = 0.02
    cap_growth_per_min: float = 0.25
    cap_min_rps: float = 0.05

    # --- the default guards (issue 17: no max_cost_premium stated) ---
    # With speed_guard_z > 0 the speed guard acts only on a gap beyond the estimates' noise:
    # the mix's expected wait over price-only's by more than speed_guard_z standard errors. An
    # estimate from n (decayed) answers is off by about speed_spread/√(2n) of itself
    # (table.py), speed_spread the answers' own spread (standard deviation over mean): 0.75
    # for a log-normal TTFT whose p95 is 3 × its median, as in the reference market
    # (config/market.yaml: 2.8–3.5 ×). 0 closes any gap the estimates show: the default,
    # since at 2 a real gap near the noise stays open
    # (market (g), gaps of 14–25 %: TTFT +0.8 % [+0.3, +1.3] against price-only) while it
    # keeps savings between equally fast endpoints ((d): cost −2.9 % against −1.7 %;
    # bench/markets/results.md).
    speed_guard_z: float = 0.0
    speed_spread: float = 0.75

    # --- stickiness (G12) ---
    sticky_hit_probability: float = 0.9  # a warm prefix is found in the cache this often

    # --- price-only router (the old behaviour, G16 baseline) ---
    legacy_outage_rate: float = 0.5  # failure fraction (fast window) that marks an outage …
    legacy_outage_min_failures: float = 3.0  # … with at least this many (decayed) failures

    # Per-model tables are rebuilt at most this often (the Redis mirror refresh period).
    refresh_interval_s: float = 1.0
