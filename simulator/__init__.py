"""The provider simulator, part of the product but outside the request path: the provider
market model (``model/``), the HTTP provider simulator (``server/``, ``manage.py providersim``)
and the switchback experiment (``switchback/``, ``manage.py switchback``), which drives the
real quota and routing cores on a simulated clock.

It sits on top: it may import ``configfile``, ``quotas``, ``routing`` and ``common``, and
nothing of the product imports it.
"""
