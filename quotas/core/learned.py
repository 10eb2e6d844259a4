"""A concurrency limit learned from a provider's 429s (SPEC B1 source "learned", G10, F2).

Some providers refuse for a limit they do not publish: a self-hosted endpoint's slots, a
small provider's concurrent requests. The broker cannot hold requests back for a limit it does
not know, so every request over it costs a round trip and a 429, and the retry meets the next
one. This learns the limit the way TCP learns a window (AIMD): a 429 that no known limit
explains cuts a per-provider concurrency bucket to ``CUT`` × the requests in flight; while it
is full, it grows by one request every ``REGROW_SECONDS``, so it finds the limit again and
follows the provider when it grows (idle time proves nothing, so it does not grow then). The
excess waits in the fair queue for a freed slot instead of meeting a 429. The arithmetic is the
concurrency rule's (``buckets.view``, ``take``, ``settle``, ``observe``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from quotas.core.model import BucketSpec, Dimension, Rule, Usage

# Growth: one more concurrent request every this many seconds while the bucket is full. At a
# limit L it comes back from a cut in (1 − CUT)·L·REGROW_SECONDS, then costs one more 429.
REGROW_SECONDS = 5.0
# A cut keeps this share of what was in flight when the provider refused.
CUT = 0.9
# Until the first unexplained 429, and as far as it may grow back: no limit in practice.
CEILING = 1024.0


def learned_name(owner: str) -> str:
    """The public name of the learned bucket of ``owner`` (e.g. ``provider:gamma``)."""
    return f"{owner}:concurrency:learned"


def learned_concurrency(scope: str, name: str) -> BucketSpec:
    """The learned concurrency bucket of one provider account (``name`` is its public name)."""
    return BucketSpec(
        name=name,
        scope=scope,
        dimension=Dimension.CONCURRENCY,
        rule=Rule.CONCURRENCY,
        capacity=CEILING,
        period=REGROW_SECONDS,
        factor=CUT,
    )


def needs_learned_concurrency(configured: Sequence[BucketSpec]) -> bool:
    """A provider account learns its concurrency unless a configured limit already gives it."""
    return not any(
        spec.rule is Rule.CONCURRENCY and not spec.shadow and not spec.learned
        for spec in configured
    )


def asked_of(dimension: str, demand: Usage) -> float:
    """What an attempt asked of a provider limit its headers describe (requests: one)."""
    if dimension == "tokens":
        return demand.input_tokens + demand.output_tokens
    if dimension == "input_tokens":
        return demand.input_tokens
    if dimension == "output_tokens":
        return demand.output_tokens
    return 1.0


def refusal_unexplained(reported: Iterable[tuple[float | None, float]]) -> bool:
    """Whether a provider 429 is a signal of an unknown (concurrency) limit.

    ``reported`` holds, per limit the 429's headers describe, (remaining, what this attempt
    asked of it). A reported limit short of the request explains the refusal: it is a rate
    limit the headers already correct (C12), not a concurrency signal.
    """
    return not any(remaining is not None and remaining < asked for remaining, asked in reported)
