"""Create (or reset) the demo superuser ``admin`` and print its password."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create or reset the demo superuser 'admin'; prints its password (kept in var/)."

    def handle(self, *args: Any, **options: Any) -> None:
        path = settings.BASE_DIR / "var" / "demo-admin-password"
        if path.exists():
            password = path.read_text().strip()
        else:
            password = secrets.token_urlsafe(12)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(password + "\n")
            path.chmod(0o600)
        user, _ = get_user_model().objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True}
        )
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(password)
