"""The Django project: settings, URLconf, the ASGI entry point and the Celery app.

It wires the apps together and owns no domain: nothing imports it but Django's settings
machinery (``DJANGO_SETTINGS_MODULE=switchyard.settings``) and the entry points
(``manage.py``, ``uvicorn switchyard.asgi:application``, ``celery -A switchyard``). It may
import every package below it.

The Celery app (``switchyard.celery``) is not imported here, unlike in Celery's Django guide:
every process would then load Celery, and the gateway's workers need it only to defer a job or
a batch (common/background.py loads it by ``settings.BACKGROUND_APP`` then). ``celery -A
switchyard`` finds ``switchyard.celery.app`` by itself; ``switchyard.celery_app`` still names it.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "celery_app":
        from switchyard.celery import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
