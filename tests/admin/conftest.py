from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from common import redis as gateway_redis


@pytest.fixture
def redis_prefix(settings: Any) -> Iterator[str]:
    """A Redis key prefix of this test alone; its keys are deleted afterwards."""
    prefix = f"sy-test-admin-{uuid.uuid4().hex[:12]}"
    settings.REDIS_PREFIX = prefix
    yield prefix
    client = gateway_redis.sync_client()
    for name in client.scan_iter(match=f"{prefix}:*"):
        client.delete(name)
