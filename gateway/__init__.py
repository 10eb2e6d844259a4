"""The proxy: the ``/v1`` front doors (OpenAI chat completions, models, jobs, generations),
the spine of one request (``pipeline``), the provider adapters (``providers/``, the back doors),
deferred jobs and the ledger writer, the health probes and the metric definitions.

It sits above the domain apps and may import ``quotas``, ``routing``, ``tenants`` and
``common``; ``ops``, ``configfile``, ``simulator``, ``bench`` and ``switchyard`` are above it and
it imports none of them.
"""
