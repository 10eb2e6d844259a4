"""Live saturation for Prometheus (SPEC H2): what every bucket holds and every queue waits.

Counters and histograms are counted by the proxy as requests pass; the fill of a bucket is a
state, read from the broker's store when Prometheus scrapes (one ``levels`` script call for
all buckets, one pipeline for the queue depths), so an alert on saturation needs nothing else.

- ``switchyard_bucket_capacity`` / ``switchyard_bucket_available`` per bucket (its name, scope
  and dimension): every configured bucket, and each provider's learned concurrency limit (its
  capacity is the limit learned so far). Saturation is ``1 - available / capacity``.
- ``switchyard_provider_queue_depth``: requests waiting in each provider pool's fair queue.
- ``switchyard_ledger_backlog``: ledger records in Redis not yet stored in the database (a
  stopped Celery worker or a failing flush shows as a growing backlog).
- ``switchyard_jobs`` per tenant and status (queued, running) and
  ``switchyard_job_oldest_wait_seconds``: the deferred work (E3, E5) not finished yet; a queue
  that only grows, or an oldest wait near the classes' deadlines, wants more capacity or
  workers.

Only platform staff read ``/metrics`` (``ops.scrape.metrics_view``): these name every
tenant's buckets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import redis
from django.conf import settings
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from gateway.jobs import jobs_open
from gateway.ledger import ledger_backlog
from quotas.core.model import BucketSpec
from quotas.levels import REDIS_TIMEOUT_SECONDS, broker_spec, store_levels
from quotas.models import Bucket
from quotas.snapshot import UNBUILDABLE, with_learned_buckets
from quotas.store.queue_redis import queue_prefix
from routing.models import Provider
from tenants.models import Tenant

log = logging.getLogger(__name__)
LABELS = ["bucket", "scope", "dimension"]


class SaturationCollector(Collector):
    """Bucket levels and queue depths, read at each scrape."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        capacity = GaugeMetricFamily(
            "switchyard_bucket_capacity",
            "A bucket's capacity (a learned limit: the value learned so far).",
            labels=LABELS,
        )
        available = GaugeMetricFamily(
            "switchyard_bucket_available", "What a bucket has left now.", labels=LABELS
        )
        depth = GaugeMetricFamily(
            "switchyard_provider_queue_depth",
            "Requests waiting in a provider pool's fair queue.",
            labels=["provider"],
        )
        backlog = GaugeMetricFamily(
            "switchyard_ledger_backlog",
            "Ledger records waiting in Redis to be stored (queued or claimed by a flush).",
        )
        yield from _jobs()
        buckets, specs = _counted_buckets()
        providers = list(Provider.objects.order_by("name"))
        try:
            levels, _ = store_levels(specs)
            depths, waiting_records = _queue_depths_and_backlog(providers)
        except (RedisError, OSError) as exc:  # the scrape still answers; the gap shows it
            log.warning("saturation metrics unavailable: %s", exc)
            return
        for bucket, level in zip(buckets, levels, strict=True):
            labels = [bucket.name, bucket.scope_kind, bucket.dimension]
            capacity.add_metric(labels, level.capacity)
            available.add_metric(labels, level.available)
        for provider, waiting in zip(providers, depths, strict=True):
            depth.add_metric([provider.name], waiting)
        backlog.add_metric([], waiting_records)
        yield capacity
        yield available
        yield depth
        yield backlog


def _jobs() -> Iterator[GaugeMetricFamily]:
    """Deferred jobs not finished, from the database (read even when Redis is away)."""
    counts, oldest = jobs_open(timezone.now())
    names = dict(Tenant.objects.filter(pk__in={t for t, _ in counts}).values_list("pk", "name"))
    jobs = GaugeMetricFamily(
        "switchyard_jobs", "Deferred jobs not finished yet.", labels=["tenant", "status"]
    )
    for (tenant_id, status), n in sorted(counts.items()):
        jobs.add_metric([names.get(tenant_id, f"#{tenant_id}"), status], n)
    yield jobs
    yield GaugeMetricFamily(
        "switchyard_job_oldest_wait_seconds",
        "How long the oldest queued job has waited since it was submitted.",
        value=oldest,
    )


def _counted_buckets() -> tuple[list[Bucket], list[BucketSpec]]:
    """Every bucket the broker counts and its spec; a row it cannot count is left out."""
    rows = list(Bucket.objects.order_by("scope_kind", "name"))
    buckets: list[Bucket] = []
    specs: list[BucketSpec] = []
    for bucket in with_learned_buckets(rows, Provider.objects.order_by("name")):
        try:
            specs.append(broker_spec(bucket))
        except UNBUILDABLE as exc:
            log.warning("bucket %r (id %s) is not counted: %s", bucket.name, bucket.pk, exc)
            continue
        buckets.append(bucket)
    return buckets, specs


def _queue_depths_and_backlog(providers: list[Provider]) -> tuple[list[int], int]:
    client = redis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=REDIS_TIMEOUT_SECONDS,
        socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
    )
    try:
        pipe = client.pipeline(transaction=False)
        for provider in providers:
            pipe.zcard(f"{queue_prefix(settings.REDIS_PREFIX, f'provider:{provider.id}')}:d")
        depths = [int(n) for n in pipe.execute()]
        return depths, ledger_backlog(client)
    finally:
        client.close()
