"""Models, providers and their endpoints (the catalogue), provider credentials, live endpoint
stats shared through Redis (``live``) and the router; ``core/`` is the pure router (routing
cost, shares and guards, overrides, stickiness), with time as an argument.

It may import ``tenants`` and ``common``; ``routing.core`` imports no app at all.
"""
