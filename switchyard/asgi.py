"""ASGI entry point: ``uvicorn switchyard.asgi:application``; the handler is ``gateway.asgi``."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchyard.settings")

from gateway.asgi import application

__all__ = ["application"]
