"""Operator metrics (SPEC H2) the proxy counts, in Prometheus format; ``/metrics`` serves them
(``ops/scrape.py``) with the saturation read at each scrape (``ops/prometheus.py``).

Labels name tenants, apps, models, providers and buckets: this page is for the platform's
operators, never for tenants (A4). Every label value comes from the configuration (a model the
catalogue knows, a provider, a tenant and app of a valid key, a workload class, a bucket) or
from a fixed set (status, reason, outcome): never from what a client sent, so the number of
series is bounded by the configuration. A request for an unknown model counts under model "".

With several uvicorn workers, set PROMETHEUS_MULTIPROC_DIR to a writable directory (the demo
does) so that every worker's counts are added up.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram

from common import metric_values  # noqa: F401 - before any metric is made

REQUESTS = Counter(
    "switchyard_requests_total",
    "Logical requests by outcome and by the door they came in by (chat, messages, …).",
    ["tenant", "model", "provider", "workload", "status", "reason", "door"],
)
ATTEMPTS = Counter(
    "switchyard_upstream_attempts_total",
    "Upstream attempts by provider and outcome (ok, capacity, overload, provider_error, …).",
    ["provider", "outcome"],
)
REFUSALS = Counter(
    "switchyard_broker_refusals_total",
    "Reservations the broker refused, by binding bucket and reason.",
    ["bucket", "reason"],
)
SHADOW_REFUSALS = Counter(
    "switchyard_shadow_refusals_total",
    "Reservations a shadow bucket would have refused (it refused nothing).",
    ["bucket"],
)
UNEXPLAINED_429 = Counter(
    "switchyard_provider_unexplained_429_total",
    "Provider 429s that no limit in their headers explains; each may cut the provider's learned "
    "concurrency limit.",
    ["provider"],
)
KEYS_REFUSED = Counter(
    "switchyard_provider_key_refused_total",
    "Provider 401/403 answers to one key of a key pool: the key left the pool (B2).",
    ["provider"],
)
RETRY_AFTER = Counter(
    "switchyard_provider_retry_after_total",
    "Provider refusals (429, 503, 529) that said when to come back, by provider.",
    ["provider"],
)
QUEUE_WAIT = Histogram(
    "switchyard_queue_wait_seconds",
    "Time requests waited for capacity, by tenant and workload class.",
    ["tenant", "workload"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)
REQUEST_DURATION = Histogram(
    "switchyard_request_duration_seconds",
    "Time from a request's arrival to the end of its answer (the last byte of a stream), by "
    "the model and provider that served it.",
    ["model", "provider"],
    buckets=LATENCY_BUCKETS,
)
TTFT = Histogram(
    "switchyard_time_to_first_token_seconds",
    "Time from a request's arrival to its first token, by model and provider.",
    ["model", "provider"],
    buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 4, 8, 15),
)
TOKENS = Counter(
    "switchyard_tokens_total",
    "Tokens providers counted, by tenant, app and kind (input, cached_input, output).",
    ["tenant", "app", "kind"],
)
COST = Counter(
    "switchyard_cost_usd_total",
    "What providers charge for the usage, in USD, by tenant and app.",
    ["tenant", "app"],
)
RETRIES = Histogram(
    "switchyard_attempts_per_request",
    "Upstream attempts per logical request (retries and fallbacks included).",
    ["workload"],
    buckets=(1, 2, 3, 4, 6, 9),
)
ESTIMATE_RATIO = Histogram(
    "switchyard_input_estimate_ratio",
    "Actual input tokens over the estimate (C11): 1 is exact, > 1 under-reservation.",
    ["model"],
    buckets=(0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0),
)
OVER_RESERVED = Counter(
    "switchyard_over_reserved_tokens_total",
    "Tokens reserved but not used (capacity held back by over-reservation until reconcile).",
    ["model"],
)

STREAM_STEPS = Counter(
    "switchyard_stream_steps_total",
    "Output reservation steps streams of an increments workload class asked for (C10), by "
    "outcome: granted, refused (a bucket was full: the stream went on, asking no more), closed "
    "(its lease was over), error (Redis failed).",
    ["outcome"],
)


_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, cached: the hot path skips prometheus_client's label
    validation and lock. Bounded as the labels are (see the module docstring)."""
    key = (id(metric), labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found
