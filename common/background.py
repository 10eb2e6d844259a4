"""The project's Celery app, loaded when a process first hands work to it.

Named by ``settings.BACKGROUND_APP`` (as Django names ``ROOT_URLCONF``) rather than imported by
the project package at start: creating the app imports Celery, kombu, click, dateutil and the
rest (~2.4 MiB of a gateway worker's RSS), which the gateway's ASGI workers need only when a
request defers a job or a batch. The Celery worker and beat load it through ``-A switchyard``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string


def background_app() -> Any:
    """The configured Celery app (created on the first call; the import is cached after)."""
    return import_string(settings.BACKGROUND_APP)
