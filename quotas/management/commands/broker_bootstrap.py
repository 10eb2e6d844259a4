"""Declare the broker's Redis state new, so a fresh deployment grants at full capacity at once.

Run it when a deployment starts for the first time (the demo and test stacks do). On a Redis
that already has broker state it changes nothing. Never needed after a Redis restart: then the
broker detects the lost state itself and grants conservatively for one lease period.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from redis.asyncio import Redis

from quotas.store.redis import RedisReservationStore


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def handle(self, *args: Any, **options: Any) -> None:
        created = asyncio.run(self._bootstrap())
        self.stdout.write("broker state: " + ("declared new" if created else "already present"))

    async def _bootstrap(self) -> bool:
        client = Redis.from_url(settings.REDIS_URL)
        try:
            return await RedisReservationStore(client, prefix=settings.REDIS_PREFIX).bootstrap()
        finally:
            await client.aclose()
