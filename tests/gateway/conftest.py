"""Fixtures of the gateway's Django tests: the reference configuration and its personas."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.personas import Personas, personas_create, redis_prefix_scope


@pytest.fixture
def redis_prefix(settings: Any) -> Iterator[str]:
    yield from redis_prefix_scope(settings)


@pytest.fixture
def personas(db: None, redis_prefix: str) -> Personas:
    return personas_create()
