"""The Django project: settings, URLconf, the ASGI entry point and the Celery app.

It wires the apps together and owns no domain: nothing imports it but Django's settings
machinery (``DJANGO_SETTINGS_MODULE=switchyard.settings``) and the entry points
(``manage.py``, ``uvicorn switchyard.asgi:application``, ``celery -A switchyard``). It may
import every package below it.
"""

from switchyard.celery import app as celery_app

__all__ = ["celery_app"]
