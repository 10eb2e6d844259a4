"""What the broker counts about itself (SPEC H2), served at /metrics with the proxy's metrics
(gateway/metrics.py; the same multiprocess registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from common import metric_values  # noqa: F401 - before any metric is made

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
BROKER_ALLOWANCES = Counter(
    "switchyard_broker_allowances_total",
    "Allowances this process took (quotas/allowances.py: one reservation for several requests "
    "while their buckets have plenty left).",
)
BROKER_ALLOWANCE_GRANTS = Counter(
    "switchyard_broker_allowance_grants_total",
    "Requests granted from an allowance, without a Redis call of their own.",
)
