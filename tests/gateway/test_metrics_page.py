"""``/metrics`` (SPEC H2) names every tenant in its labels: platform operators only (A4)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from tests.personas import Personas, personas_create, redis_prefix_scope


@pytest.fixture
def redis_prefix(settings: Any) -> Iterator[str]:
    yield from redis_prefix_scope(settings)


@pytest.fixture
def personas(db: None, redis_prefix: str) -> Personas:
    return personas_create()


def test_it_shows_metrics_to_platform_staff(personas: Personas) -> None:
    page = personas.client(personas.staff).get("/metrics")
    assert page.status_code == 200
    assert b"switchyard_requests_total" in page.content


@pytest.mark.parametrize("member", ["alice", "bob", "carol"])
def test_it_never_shows_metrics_to_a_tenant_member(personas: Personas, member: str) -> None:
    # Members are staff (they sign in to the admin), yet the labels name other tenants.
    user = getattr(personas, member)
    assert user.is_staff
    page = personas.client(user).get("/metrics")
    assert page.status_code == 403
    assert b"switchyard_" not in page.content


def test_it_sends_a_visitor_to_the_admin_login(personas: Personas) -> None:
    page = Client().get("/metrics")
    assert page.status_code == 302 and "/admin/login/" in page["Location"]
