"""Model aliases (issue 16 item 5): names clients send for a model, from the config file and the
admin, unique across every model's names; the catalogue finds a model by either."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client

from configfile import ConfigError
from configfile.apply import config_load
from gateway.model_objects import model_object
from gateway.snapshot import snapshot_build
from routing.models import Model
from tests.personas import REFERENCE, Personas, field_errors, personas_create, redis_prefix_scope
from tests.personas import admin_url as url

ENV = {"ALPHA_API_KEY": "a", "BETA_API_KEY": "b", "GAMMA_API_KEY": "g"}


@pytest.fixture
def personas(db: None, settings: Any) -> Iterator[Personas]:
    for _prefix in redis_prefix_scope(settings):
        yield personas_create()


@pytest.fixture
def staff(personas: Personas) -> Client:
    return personas.client(personas.staff)


def test_the_reference_file_names_aliases_and_the_catalogue_finds_a_model_by_them(
    personas: Personas,
) -> None:
    assert Model.objects.get(slug="acme/chat-large").aliases == ["claude-sonnet-4-5"]
    catalogue = snapshot_build(1).catalogue

    large = catalogue.model_named("claude-sonnet-4-5")
    assert large is not None and large is catalogue.model_named("acme/chat-large")
    assert large.slug == "acme/chat-large" and large.aliases == ("claude-sonnet-4-5",)
    assert catalogue.model_named("text-embedding-3-small") is catalogue.models["acme/embed-small"]
    assert catalogue.model_named("claude-opus-4") is None


def test_a_model_object_under_an_alias_names_the_model_it_stands_for(personas: Personas) -> None:
    large = snapshot_build(1).catalogue.models["acme/chat-large"]
    assert model_object(large)["id"] == "acme/chat-large"
    aliased = model_object(large, "claude-sonnet-4-5")
    assert (aliased["id"], aliased["canonical_slug"]) == ("claude-sonnet-4-5", "acme/chat-large")
    assert aliased["aliases"] == ["claude-sonnet-4-5"]


def test_an_inactive_model_lends_its_aliases_to_no_one(personas: Personas) -> None:
    Model.objects.filter(slug="acme/chat-large").update(is_active=False)
    assert snapshot_build(1).catalogue.model_named("claude-sonnet-4-5") is None


def _config_with(tmp_path: Path, **aliases: list[str]) -> Path:
    data = yaml.safe_load(REFERENCE.read_text())
    for model in data["models"]:
        model["aliases"] = aliases.get(model["slug"].replace("acme/", "").replace("-", "_"), [])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("aliases", "error"),
    [
        (
            {"chat_large": ["gpt-4o"], "chat_small": ["gpt-4o"]},
            "models[1].aliases[0]: 'gpt-4o' is already a name of models[0]",
        ),
        (
            {"chat_small": ["acme/chat-large"]},
            "models[1].aliases[0]: 'acme/chat-large' is already a name of models[0]",
        ),
        (
            {"chat_large": ["gpt 4o"]},
            "models[0].aliases[0]: must be a model id (letters, digits, . _ / -), got 'gpt 4o'",
        ),
    ],
)
def test_the_file_refuses_a_name_two_models_would_answer_to(
    tmp_path: Path, db: None, settings: Any, aliases: dict[str, list[str]], error: str
) -> None:
    for _prefix in redis_prefix_scope(settings):
        with pytest.raises(ConfigError) as raised:
            config_load(_config_with(tmp_path, **aliases), env=ENV)
        assert [e for e in raised.value.errors if "aliases" in e] == [error]


MODEL = {
    "slug": "test/new-model",
    "default_output_tokens": "400",
    "default_input_tokens": "",
    "max_cost_premium": "0.06",
    "allow_fallbacks": "on",
    "routing_parameters": "{}",
    "is_active": "on",
    "endpoints-TOTAL_FORMS": "0",
    "endpoints-INITIAL_FORMS": "0",
}


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"aliases": "claude-sonnet-4-5"}, "aliases", "already a name of the model"),
        ({"aliases": "gpt-4o, acme/chat-small"}, "aliases", "already a name of the model"),
        ({"aliases": "x, x"}, "aliases", "names an alias twice"),
        ({"aliases": "test/new-model"}, "aliases", "the model's own id"),
        ({"aliases": "gpt 4o"}, "aliases", "a model id (letters, digits"),
        ({"slug": "claude-sonnet-4-5", "aliases": ""}, "slug", "is an alias of the model"),
    ],
)
def test_the_admin_refuses_what_the_file_refuses(
    staff: Client, fields: dict[str, str], field: str, words: str
) -> None:
    answer = staff.post(url(Model, "add"), {**MODEL, **fields})

    assert words in field_errors(answer, field)
    assert not Model.objects.filter(slug__in=["test/new-model", "claude-sonnet-4-5"]).exists()


def test_the_admin_saves_aliases(staff: Client) -> None:
    # Typed as a person types them: names separated by commas, spaces and a trailing comma aside.
    answer = staff.post(url(Model, "add"), {**MODEL, "aliases": " gpt-4o,gpt-4o-mini , "})

    assert answer.status_code == 302
    model = Model.objects.get(slug="test/new-model")
    assert model.aliases == ["gpt-4o", "gpt-4o-mini"]
    listing = staff.get(url(Model, "changelist"))
    assert "gpt-4o, gpt-4o-mini" in listing.content.decode()
    form = staff.get(url(Model, "change", model.pk)).content.decode()
    assert 'value="gpt-4o, gpt-4o-mini"' in form
    editable = [f.name for f in Model._meta.concrete_fields if f.editable and not f.auto_created]
    assert [name for name in editable if f'name="{name}"' not in form] == []  # none left out


@pytest.mark.parametrize(
    ("requested", "routed"),
    [
        ("claude-sonnet-4-5", "acme/chat-large"),
        ("claude-sonnet-4-5:nitro", "acme/chat-large:nitro"),
        ("acme/chat-small:floor", "acme/chat-small:floor"),
        ("unknown-model", "unknown-model"),
    ],
)
def test_the_router_is_asked_by_the_models_slug_suffix_kept(
    personas: Personas, requested: str, routed: str
) -> None:
    assert snapshot_build(1).catalogue.routing_name(requested) == routed
