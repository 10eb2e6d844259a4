"""The test suite, mirroring the packages (``tests/quotas/…``, ``tests/routing/…``);
``tests/e2e/`` and ``tests/browser/`` run real processes (``tests/stack.py``). Outside the
layers: it may import everything.
"""
