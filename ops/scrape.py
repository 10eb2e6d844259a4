"""``/metrics`` (SPEC H2): what the proxy counted (``gateway/metrics.py``) and the saturation
read at each scrape (``ops/prometheus.py``), in Prometheus format, for a scraper sending
``Authorization: Bearer <METRICS_TOKEN>`` or platform staff who may see every tenant
(``tenants.view_tenant``, as for the ops pages; superusers pass). Anyone else: 401 with
``WWW-Authenticate: Bearer`` (a scraper cannot follow a redirect to a login page).
"""

from __future__ import annotations

import hmac
import os

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)

from ops.prometheus import SaturationCollector
from tenants.scoping import tenant_member


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
