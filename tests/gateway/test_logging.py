"""The gateway log: a client error is one line, a server error keeps its traceback."""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.test import Client
from django.urls import path


def _forbidden(request: HttpRequest) -> HttpResponse:
    raise PermissionDenied


def _missing(request: HttpRequest) -> HttpResponse:
    raise Http404


def _broken(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a real error")


urlpatterns = [
    path("forbidden/", _forbidden),
    path("missing/", _missing),
    path("broken/", _broken),
]


@pytest.fixture
def client(settings: pytest.FixtureRequest) -> Client:
    settings.ROOT_URLCONF = __name__  # type: ignore[attr-defined]
    return Client(raise_request_exception=False)


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "django.request"]


@pytest.mark.parametrize(("url", "status"), [("/forbidden/", 403), ("/missing/", 404)])
def test_it_logs_a_client_error_in_one_line(
    client: Client, caplog: pytest.LogCaptureFixture, url: str, status: int
) -> None:
    with caplog.at_level(logging.WARNING):
        assert client.get(url).status_code == status

    (record,) = _records(caplog)
    assert record.exc_info is None
    assert url in record.getMessage()
    assert "Traceback" not in caplog.text


def test_it_keeps_the_traceback_of_a_server_error(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert client.get("/broken/").status_code == 500

    (record,) = _records(caplog)
    assert record.exc_info is not None
    assert "Traceback" in caplog.text and "RuntimeError: a real error" in caplog.text


@pytest.mark.django_db
def test_it_logs_an_admin_403_without_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    operator = User.objects.create_user("operator", is_staff=True)  # staff, no permissions
    client = Client(raise_request_exception=False)
    client.force_login(operator)

    with caplog.at_level(logging.WARNING):
        assert client.get("/admin/tenants/tenant/add/").status_code == 403

    (record,) = _records(caplog)
    assert record.getMessage().startswith("Forbidden (Permission denied)")
    assert "Traceback" not in caplog.text
