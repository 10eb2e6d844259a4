"""Operator metrics (SPEC H2) in Prometheus format, served at ``/metrics`` to platform staff who
may see every tenant (``tenants.view_tenant``, as for the ops pages; superusers pass).

Labels name tenants, models, providers and buckets: this page is for the platform's operators,
never for tenants (A4). With several uvicorn workers, set PROMETHEUS_MULTIPROC_DIR to a
writable directory (the demo does) so that every worker's counts are added up.
"""

from __future__ import annotations

import os

from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
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
    "Time requests waited for capacity.",
    ["workload"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
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


@staff_member_required
def metrics_view(request: HttpRequest) -> HttpResponse:
    user = request.user
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


def _process_registry() -> CollectorRegistry:
    """What the proxy counted: summed over its worker processes when there are several."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY
