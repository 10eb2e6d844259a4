"""Operator pages per tenant (SPEC G15, H3): the activity log and the saturation page.

Plain Django views under ``/ops/``, behind the admin's sign-in and in its look; a tenant's
members see their own tenant's pages, platform staff every tenant's. Also ``/metrics``
(``scrape``), with the Prometheus collectors read at scrape time (``prometheus``).

Above the proxy: it may import ``gateway`` and the domain apps below it; only ``switchyard``
imports it.
"""
