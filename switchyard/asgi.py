"""ASGI entry point: ``uvicorn switchyard.asgi:application``; the handler is ``gateway.asgi``."""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchyard.settings")

# httpx's package imports its command-line client (``httpx._main``: rich, pygments, click; ~2.3
# MiB of each worker's RSS) whenever those are installed, and falls back to a stub ``main`` when
# the import fails. A server process never runs that client; this entry point alone stops it
# (management commands and Celery keep httpx as it is).
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
# Django REST framework imports ``requests`` whenever it is installed (the test tools install it),
# for its test client alone (``rest_framework.test``): ~4.4 MiB of each worker's RSS. No server
# code sends with it; the proxy's client is aiohttp.
sys.modules.setdefault("requests", None)  # type: ignore[arg-type]

from gateway.asgi import application  # noqa: E402

__all__ = ["application"]
