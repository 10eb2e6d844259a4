"""The Celery app: background work that does not belong in a request (ledger, reaping, roll-ups)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchyard.settings")

app = Celery("switchyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
