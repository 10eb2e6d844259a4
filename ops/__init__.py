"""Operator pages per tenant (SPEC G15, H3): the activity log and the saturation page.

Plain Django views under ``/ops/``, behind the admin's sign-in and in its look; a tenant's
members see their own tenant's pages, platform staff every tenant's.
"""
