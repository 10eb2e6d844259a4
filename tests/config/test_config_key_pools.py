"""Provider organisations with projects, key pools and endpoint limits in the config file
(SPEC B2, D1; issue 18 items 1 and 2): parsing, clear errors, and loading into the database."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from configfile import ConfigError, config_parse, config_read
from configfile.apply import config_load
from configfile.scopes import scoped_limits
from quotas.models import Bucket
from quotas.names import bucket_name
from quotas.snapshot import quota_snapshot_build
from routing import credentials
from routing.catalogue import catalogue_build
from routing.models import Credential, ProviderProject

REFERENCE = Path(__file__).resolve().parents[2] / "config" / "switchyard.yaml"
ENV = {
    "ALPHA_API_KEY": "alpha-secret-1",
    "BETA_API_KEY": "beta-secret-1",
    "GAMMA_API_KEY": "g",
    "ALPHA_KEY_1": "alpha-pool-1",
    "ALPHA_KEY_2": "alpha-pool-2",
    "ALPHA_KEY_3": "alpha-pool-3",
}
POOL: dict[str, Any] = {
    "projects": [
        {
            "name": "research",
            "limits": [{"dimension": "output_tokens", "capacity": 30000, "per": "1m"}],
        }
    ],
    "keys": [
        {
            "name": "key-1",
            "api_key_env": "ALPHA_KEY_1",
            "project": "research",
            "limits": [{"dimension": "requests", "capacity": 60, "per": "1m"}],
        },
        {
            "name": "key-2",
            "api_key_env": "ALPHA_KEY_2",
            "limits": [{"dimension": "requests", "capacity": 90, "per": "1m"}],
        },
        {"name": "key-3", "api_key_env": "ALPHA_KEY_3"},
    ],
}


def pooled() -> dict[str, Any]:
    """The reference file with alpha as an organisation of three keys and one project."""
    data = config_read(REFERENCE)
    assert isinstance(data, dict)
    alpha = data["providers"][0]
    del alpha["api_key_env"]
    alpha.update(copy.deepcopy(POOL))
    data["models"][0]["endpoints"][0]["limits"] = [
        {"dimension": "input_tokens", "capacity": 200000, "per": "1m"}
    ]
    return data


def errors_of(data: object) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        config_parse(data)
    return raised.value.errors


def test_every_example_file_still_parses_unchanged() -> None:
    root = REFERENCE.parents[1]
    files = [*sorted((root / "config").glob("switchyard*.yaml"))]
    files += sorted((root / "docs" / "examples").glob("switchyard*.yaml"))
    files += sorted(Path("/work/shared/examples").glob("switchyard*.yaml"))
    assert files
    for path in files:
        config = config_parse(config_read(path))
        assert all(not p.keys and not p.projects for p in config.providers), path


def test_it_names_the_buckets_of_every_provider_side_scope() -> None:
    names = {bucket_name(scope, limit) for scope, limit in scoped_limits(config_parse(pooled()))}

    assert {
        "provider:alpha:requests:1m",
        "project:alpha/research:output_tokens:1m",
        "credential:alpha/key-1:requests:1m",
        "credential:alpha/key-2:requests:1m",
        "endpoint:acme/chat-large@alpha:input_tokens:1m",
    } <= names


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda a: a.update(api_key_env="ALPHA_API_KEY"),
            "providers[0].api_key_env: give either api_key_env (one key) or keys (a key pool), "
            "not both",
        ),
        (
            lambda a: a["keys"][1].update(project="reserch"),
            "providers[0].keys[1].project: unknown project 'reserch' (known: research)",
        ),
        (
            lambda a: a["keys"][2].update(name="key-1"),
            "providers[0].keys[2].name: duplicate key 'key-1' (also providers[0].keys[0])",
        ),
        (
            lambda a: a["keys"][2].update(api_key_env="ALPHA_KEY_1"),
            "providers[0].keys[2].api_key_env: duplicate key variable 'ALPHA_KEY_1' "
            "(also providers[0].keys[0])",
        ),
        (
            lambda a: a["keys"][0].pop("api_key_env"),
            "providers[0].keys[0].api_key_env: is required",
        ),
        (
            lambda a: a["keys"][0].update(api_key_env="alpha key"),
            "providers[0].keys[0].api_key_env: must be an environment variable name",
        ),
        (
            lambda a: a["keys"][0].update(secret="sk-live"),
            "providers[0].keys[0].secret: unknown key",
        ),
        (
            lambda a: a["keys"][1]["limits"][0].update(capacity=-1),
            "providers[0].keys[1].limits[0].capacity:",
        ),
        (
            lambda a: a["projects"].append({"name": "research"}),
            "providers[0].projects[1].name: duplicate project 'research' (also providers[0].projects[0])",
        ),
        (lambda a: a.update(keys={"key-1": {}}), "providers[0].keys: must be a list"),
    ],
)
def test_it_refuses_a_bad_pool_naming_the_field(edit, expected: str) -> None:
    data = pooled()
    edit(data["providers"][0])

    errors = errors_of(data)

    assert any(e.startswith(expected) for e in errors), errors


def test_it_refuses_a_bad_endpoint_limit_by_its_path() -> None:
    data = pooled()
    data["models"][0]["endpoints"][0]["limits"][0]["dimension"] = "input_tokenz"

    errors = errors_of(data)

    assert any(e.startswith("models[0].endpoints[0].limits[0].dimension:") for e in errors), errors


@pytest.mark.django_db
def test_it_loads_the_pool_and_the_hot_path_sees_every_scope(
    tmp_path: Path, redis_prefix: str
) -> None:
    path = tmp_path / "pooled.yaml"
    path.write_text(yaml.safe_dump(pooled(), sort_keys=False))

    summary = config_load(path, env=ENV)

    assert summary.count("provider key", "created") == 3
    assert summary.count("provider project", "created") == 1
    keys = {c.name: c for c in Credential.objects.filter(provider__name="alpha")}
    assert credentials.decrypt(keys["key-2"].api_key_encrypted) == "alpha-pool-2"
    assert keys["key-1"].project == ProviderProject.objects.get(name="research")
    kinds = dict(Bucket.objects.values_list("name", "scope_kind"))
    assert kinds["credential:alpha/key-1:requests:1m"] == "credential"
    assert kinds["project:alpha/research:output_tokens:1m"] == "project"
    assert kinds["endpoint:acme/chat-large@alpha:input_tokens:1m"] == "endpoint"

    catalogue = catalogue_build()
    pool = catalogue.providers["alpha"].pool
    assert [(c.name, c.api_key) for c in pool] == [
        ("key-1", "alpha-pool-1"),
        ("key-2", "alpha-pool-2"),
        ("key-3", "alpha-pool-3"),
    ]
    # A provider without keys keeps its one account key.
    [beta] = catalogue.providers["beta"].pool
    assert (beta.id, beta.api_key) == (None, "beta-secret-1")
    snapshot = quota_snapshot_build()
    key_1 = snapshot.buckets[("credential", keys["key-1"].pk)]
    assert [b.spec.name for b in key_1] == ["credential:alpha/key-1:requests:1m"]
    # The provider's headroom applies to the key's bucket as to the organisation's.
    assert key_1[0].spec.capacity == pytest.approx(59.0)

    # A second load changes nothing; a key the file drops leaves the pool (deactivated).
    assert not config_load(path, env=ENV).changed
    data = pooled()
    data["providers"][0]["keys"].pop()
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    pruned = config_load(path, env=ENV, prune=True)
    assert any(
        r.line() == "provider key alpha/key-3: deactivated (not in the file)"
        for r in pruned.removals
    )
    assert [c.name for c in catalogue_build().providers["alpha"].pool] == ["key-1", "key-2"]


def test_the_readmes_key_pool_example_parses() -> None:
    readme = (REFERENCE.parents[1] / "README.md").read_text()
    section = readme.split("**An organisation with several keys")[1]
    block = section.split("```yaml")[1].split("```")[0]

    config = config_parse(yaml.safe_load(block))

    assert [k.name for k in config.providers[0].keys] == ["key-1", "key-2"]
    assert config.providers[0].keys[0].project == "research"
    assert config.models[0].endpoints[0].limits[0].capacity == 3000
