"""Partner → tenant → team → app → API key: the rows, key generation, rotation and revocation,
identity (a key resolved to a typed ``Principal`` from the in-memory snapshot) and tenant
scoping of the admin, with the config-reloading admin base every app's admin builds on.

The bottom domain app: it imports only ``common``.
"""
