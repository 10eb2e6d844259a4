"""A configured limit's fields → the core's ``BucketSpec`` (B1, B3), without Django.

``quotas.snapshot.bucket_spec`` feeds it a ``Bucket`` row's fields; the switchback simulation
feeds it a parsed configuration file's ``LimitSpec``, so both see the very same buckets —
provider refill buckets then less their headroom (``with_headroom``), in both.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from zoneinfo import ZoneInfo

from quotas.core.model import BucketSpec, Dimension, Rule, Window

# A ramp with no configured floor may always send this many requests per interval, so traffic
# can start from idle; from there it may grow by the configured factor per interval.
RAMP_DEFAULT_FLOOR = 20.0


def bucket_spec_build(
    *,
    name: str,
    scope: str,
    dimension: str,
    rule: str,
    capacity: float | None,
    period_seconds: float | None,
    duration_seconds: float | None,
    window: str,
    resets_at: dt.time | None,
    timezone: str,
    factor: float | None,
    shadow: bool,
) -> BucketSpec:
    """The core's view of one configured limit; ``scope`` becomes its Redis hash tag.

    Raises ``ValueError`` for a limit that cannot be counted (the message names it).
    """
    kind = Rule(rule)
    cap: float | None = capacity
    period: float | None = period_seconds
    if kind is Rule.RAMP:
        dim = Dimension.REQUESTS
        cap = capacity or RAMP_DEFAULT_FLOOR
        period = period_seconds or 60.0
    elif kind is Rule.ROLLING_WINDOW:
        dim, period = Dimension(dimension), duration_seconds
    else:
        dim = Dimension(dimension)
    reset_seconds = 0.0
    if resets_at is not None:
        reset_seconds = resets_at.hour * 3600 + resets_at.minute * 60 + resets_at.second
    zone = timezone or "UTC"
    if kind is Rule.FIXED_WINDOW:
        zone_check(name, zone)
    return BucketSpec(
        name=name,
        scope=scope,
        dimension=dim,
        rule=kind,
        capacity=float(cap or 0.0),
        period=float(period or 0.0),
        window=Window(window) if window else None,
        resets_at=reset_seconds,
        timezone=zone,
        factor=float(factor or 1.0),
        shadow=shadow,
    )


def zone_check(name: str, timezone: str) -> None:
    """``ValueError`` unless ``timezone`` is a known IANA zone: caught when the configuration is
    read, rather than by every request that computes the bucket's window."""
    try:
        ZoneInfo(timezone)
    except (LookupError, ValueError, OSError):  # not found, malformed key, unreadable path
        raise ValueError(f"{name}: unknown time zone '{timezone}'") from None


def with_headroom(spec: BucketSpec, seconds: float) -> BucketSpec:
    """A provider refill bucket as the broker should count it: less what refills in ``seconds``.

    The broker's bucket drains when it grants, the provider's when the request arrives — later,
    by a delay that varies per request. So the provider's refill runs behind ours by up to that
    spread, and a grant made the instant our bucket holds one token can meet an empty bucket
    there (a 429 we could have prevented). Holding back the refill of ``seconds`` absorbs it.
    """
    if spec.rule is not Rule.REFILL or seconds <= 0:
        return spec
    kept = spec.capacity - spec.capacity / spec.period * seconds
    return replace(spec, capacity=kept) if kept >= 1 else spec


# Providers whose input-token limit does not count prompt-cache reads: Anthropic's ITPM on
# current models (research/reliability.md §1.2). OpenAI counts cached tokens toward TPM.
CACHE_READS_FREE_PROTOCOLS = frozenset({"anthropic"})
# Providers whose output- and total-token limits count a call's max_tokens when they accept it:
# OpenAI and Azure OpenAI (TPM "includes ... the max_tokens parameter setting"), Anthropic's OTPM
# ("estimated based on max_tokens at the beginning of each request"; research/reliability.md §1).
MAX_OUTPUT_COUNTED_PROTOCOLS = frozenset({"openai", "anthropic"})


def with_provider_rules(spec: BucketSpec, protocol: str) -> BucketSpec:
    """A provider bucket as that provider counts it (``BucketSpec.cached_input_free``,
    ``BucketSpec.counts_max_output``)."""
    if spec.dimension is Dimension.INPUT_TOKENS and protocol in CACHE_READS_FREE_PROTOCOLS:
        return replace(spec, cached_input_free=True)
    if (
        spec.dimension in (Dimension.OUTPUT_TOKENS, Dimension.TOTAL_TOKENS)
        and protocol in MAX_OUTPUT_COUNTED_PROTOCOLS
    ):
        return replace(spec, counts_max_output=True)
    return spec
