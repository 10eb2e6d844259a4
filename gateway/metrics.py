"""Operator metrics (SPEC H2) in Prometheus format at ``/metrics``, for a scraper sending
``Authorization: Bearer <METRICS_TOKEN>`` or platform staff who may see every tenant
(``tenants.view_tenant``, as for the ops pages; superusers pass). Anyone else: 401 with
``WWW-Authenticate: Bearer`` (a scraper cannot follow a redirect to a login page).

Labels name tenants, apps, models, providers and buckets: this page is for the platform's
operators, never for tenants (A4). Every label value comes from the configuration (a model the
catalogue knows, a provider, a tenant and app of a valid key, a workload class, a bucket) or
from a fixed set (status, reason, outcome): never from what a client sent, so the number of
series is bounded by the configuration. A request for an unknown model counts under model "".

With several uvicorn workers, set PROMETHEUS_MULTIPROC_DIR to a writable directory (the demo
does) so that every worker's counts are added up.
"""

from __future__ import annotations

import hmac
import os
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from tenants.scoping import tenant_member

REQUESTS = Counter(
    "switchyard_requests_total",
    "Logical requests by outcome.",
    ["tenant", "model", "provider", "workload", "status", "reason"],
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


BROKER_RECOVERING = Gauge(
    "switchyard_broker_recovering",
    "1 while the broker relearns its Redis state (new or lost; quotas/recovery.py): concurrency "
    "and window limits refuse with reason 'recovering' until the processes that may hold "
    "reservations have re-registered them.",
    multiprocess_mode="livemax",
)
BROKER_RECOVERIES = Counter(
    "switchyard_broker_recoveries_total",
    "Learning periods this process ended, by what the Redis state was: new (nothing could be "
    "in flight) or lost (reservations may have been, and were re-registered).",
    ["kind"],
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


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _scraper(request):
        user = request.user
        if not (user.is_authenticated and user.is_staff):
            response = HttpResponse(
                "Send 'Authorization: Bearer <METRICS_TOKEN>' or sign in as staff.\n",
                status=401,
                content_type="text/plain",
            )
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        # Members are staff to sign in to the admin, not operators; other staff need the ops
        # pages' permission, since these labels name every tenant.
        operator = user.is_superuser or user.has_perm("tenants.view_tenant")
        if tenant_member(user) is not None or not operator:
            raise PermissionDenied("Metrics are for the platform's operators.")
    from ops.prometheus import SaturationCollector  # models: not at the proxy's import time

    data = generate_latest(_process_registry())
    # The live saturation is read from the store at each scrape (ops.prometheus).
    saturation = CollectorRegistry()
    saturation.register(SaturationCollector())
    data += generate_latest(saturation)
    return HttpResponse(data, content_type=CONTENT_TYPE_LATEST)


def _scraper(request: HttpRequest) -> bool:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    given = token.strip().encode()
    # Every configured token is compared, in constant time, so timing tells nothing.
    matches = [hmac.compare_digest(given, t.encode()) for t in settings.METRICS_TOKENS]
    return any(matches)


def _process_registry() -> CollectorRegistry:
    """What the proxy counted: summed over its worker processes when there are several."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY
