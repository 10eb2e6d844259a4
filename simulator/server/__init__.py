"""The live provider simulator: real HTTP on loopback, one port (and process) per provider.

``http`` is the HTTP/1.1 layer (asyncio + httptools), ``openai_wire`` / ``anthropic_wire`` the
two wire protocols, ``app`` ties a port to :class:`simulator.model.ProviderBehaviour`, and
``process`` is the per-provider process started by :mod:`simulator.launcher`.
"""
