from django.apps import AppConfig


class ConfigfileConfig(AppConfig):
    # No models: an app so that Django finds ``manage.py loadconfig``.
    name = "configfile"
