"""Loaded by ``-p`` before Django's settings (pyproject's addopts): each pytest-xdist worker gets
a Redis key prefix of its own, as pytest-django gives it a test database of its own (``_gw0``…),
so two workers never share a key. Without xdist this does nothing."""

from __future__ import annotations

import os

_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker:
    os.environ["REDIS_PREFIX"] = f"{os.environ.get('REDIS_PREFIX', 'sytest')}-{_worker}"
