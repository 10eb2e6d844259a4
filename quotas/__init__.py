"""Canonical buckets and their limits, estimation, the broker (reserve / reconcile / release),
fair queues, workload classes, learned provider limits and the retry policy. ``core/`` is the
pure arithmetic (no Django, no Redis, time as an argument); ``store/`` keeps the hot state in
Redis (Lua next to it) or in memory; the bucket admin and its inline on the tenant-side and
provider-side pages are composed here, since quotas owns those rows.

The top domain app: it may import ``routing``, ``tenants`` and ``common`` (a bucket's scope
names a tenant-side node or a provider/model); ``quotas.core`` imports no app at all.
"""
