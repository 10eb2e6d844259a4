from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from common import redis as gateway_redis

REFERENCE = Path(__file__).resolve().parents[2] / "config" / "switchyard.yaml"


@pytest.fixture
def reference_path() -> Path:
    return REFERENCE


@pytest.fixture
def redis_prefix(settings: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis key prefix of this test alone; its keys are deleted afterwards."""
    prefix = f"sy-test-config-{uuid.uuid4().hex[:12]}"
    settings.REDIS_PREFIX = prefix  # type: ignore[attr-defined]
    yield prefix
    client = gateway_redis.sync_client()
    for name in client.scan_iter(match=f"{prefix}:*"):
        client.delete(name)
