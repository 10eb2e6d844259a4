"""/v1/models objects (issue 14): OpenAI's fields with OpenRouter's context length, pricing per
token as strings, supported parameters, and each endpoint's own; ``created`` is the model row's
creation time, carried in the snapshot."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.model_objects import model_object, per_token
from gateway.snapshot import snapshot_build
from routing.models import Model
from tests.personas import Personas


@pytest.mark.parametrize(
    ("per_million", "expected"),
    [(0.5, "0.0000005"), (3.0, "0.000003"), (0.05, "0.00000005"), (0.0, "0"), (15, "0.000015")],
)
def test_it_prices_per_token_as_a_plain_decimal_string(per_million: float, expected: str) -> None:
    assert per_token(per_million) == expected


def test_it_describes_a_model_like_openrouter(personas: Personas) -> None:
    created = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    Model.objects.filter(slug="acme/chat-large").update(created_at=created)

    large = model_object(snapshot_build(1).catalogue.models["acme/chat-large"])

    assert large["id"] == "acme/chat-large" and large["object"] == "model"
    assert large["created"] == int(created.timestamp())
    assert large["context_length"] == 200000  # the widest endpoint (beta)
    # The model's price is its cheapest endpoint's (alpha: 0.50 in, 1.50 out per million).
    assert large["pricing"] == {
        "prompt": "0.0000005",
        "completion": "0.0000015",
        "input_cache_read": "0.00000005",
        "request": "0",
    }
    by_provider = {e["provider_name"]: e for e in large["endpoints"]}
    assert list(by_provider) == ["alpha", "beta", "gamma"]  # configured order
    assert by_provider["gamma"]["pricing"]["completion"] == "0.000003"
    assert by_provider["gamma"]["context_length"] == 65536
    assert by_provider["gamma"]["max_completion_tokens"] == 4096
    assert "response_format" in by_provider["alpha"]["supported_parameters"]
    assert "response_format" not in by_provider["beta"]["supported_parameters"]
    assert "tools" not in by_provider["gamma"]["supported_parameters"]
    assert {"tools", "response_format", "max_tokens", "temperature"} <= set(
        large["supported_parameters"]
    )


def test_a_new_model_is_created_now(personas: Personas) -> None:
    before = datetime.now(UTC).timestamp()
    model = Model.objects.create(slug="acme/fresh")
    assert before - 1 <= model.created_at.timestamp() <= datetime.now(UTC).timestamp()


def test_an_embedding_model_lists_the_embeddings_parameters(personas: Personas) -> None:
    embed = model_object(snapshot_build(1).catalogue.models["acme/embed-small"])
    assert embed["supported_parameters"] == ["dimensions", "encoding_format", "user"]
    assert embed["endpoints"][0]["supported_parameters"] == embed["supported_parameters"]
