"""H2: a request refused before its model and class are settled is still counted under the
model it asked for and its app's workload class, not under "" and "default"."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator

import pytest
from django.test import Client
from prometheus_client import REGISTRY

from common import redis as sy_redis
from gateway import pipeline
from gateway.call import Call
from gateway.errors import PermissionDenied, UnknownModel
from gateway.snapshot import Snapshot, holder, snapshot_build
from tenants.identity import Principal
from tenants.models import ApiKey
from tests.personas import ACME_KEY, Personas


@pytest.fixture
def snapshot(personas: Personas) -> Snapshot:
    return snapshot_build(1)


def _small_only(snapshot: Snapshot) -> Principal:
    """acme's web key (app class: interactive), allowed acme/chat-small only."""
    principal = snapshot.keys.identify(ACME_KEY, now=time.time())
    assert principal is not None and principal.workload == "interactive"
    return dataclasses.replace(principal, allowed_models=frozenset({"acme/chat-small"}))


def test_it_knows_the_model_and_class_of_a_refused_model(snapshot: Snapshot) -> None:
    principal = _small_only(snapshot)
    call = Call(principal=principal)

    with pytest.raises(PermissionDenied):
        pipeline._model(snapshot, principal, {"model": "acme/chat-large"}, call=call)

    assert call.model is not None and call.model.slug == "acme/chat-large"
    assert call.workload.name == "interactive"


def test_it_keeps_the_asked_model_when_a_fallback_is_refused(snapshot: Snapshot) -> None:
    principal = _small_only(snapshot)
    call = Call(principal=principal)
    body = {"model": "acme/chat-small", "models": ["acme/chat-large"]}

    with pytest.raises(PermissionDenied):
        pipeline._model(snapshot, principal, body, call=call)

    assert call.model is not None and call.model.slug == "acme/chat-small"


def test_it_leaves_an_unknown_model_out_of_the_labels(snapshot: Snapshot) -> None:
    principal = _small_only(snapshot)
    call = Call(principal=principal)

    with pytest.raises(UnknownModel):
        pipeline._model(snapshot, principal, {"model": "acme/no-such"}, call=call)

    assert call.model is None  # a client could mint any number of label values
    assert call.workload.name == "interactive"


@pytest.fixture
def fresh_holder(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A snapshot read on this request's own loop: the process's async Redis client may hold
    connections made on an earlier test's loop, long closed (a 503 in CI)."""
    monkeypatch.setattr(sy_redis, "_async_client", None)
    holder.reset()
    yield
    holder.reset()


def _requests(**labels: str) -> float:
    labels = {"door": "chat", **labels}
    return REGISTRY.get_sample_value("switchyard_requests_total", labels) or 0.0


def test_it_counts_a_refused_model_under_the_model_asked_and_the_apps_class(
    personas: Personas, fresh_holder: None
) -> None:
    ApiKey.objects.filter(name="ci", app__name="web").update(allowed_models=["acme/chat-small"])
    labels = {
        "tenant": "acme",
        "model": "acme/chat-large",
        "provider": "",
        "workload": "interactive",
        "status": "403",
        "reason": "model_not_allowed",
    }
    before = _requests(**labels)

    answer = Client().post(
        "/v1/chat/completions",
        json.dumps({"model": "acme/chat-large", "messages": [{"role": "user", "content": "hi"}]}),
        content_type="application/json",
        headers={"authorization": f"Bearer {ACME_KEY}"},
    )

    assert answer.status_code == 403, answer.content
    assert _requests(**labels) == before + 1
