"""loadconfig against PostgreSQL: the reference file, idempotence, atomicity, the command."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import CommandError, call_command

from common import redis as gateway_redis
from configfile import ConfigError
from configfile.apply import KINDS, config_load
from configfile.management.commands import loadconfig
from quotas.core.increments import StepPlan
from quotas.models import Bucket, WorkloadClass
from quotas.snapshot import quota_snapshot_build
from routing.catalogue import catalogue_build
from routing.core.contracts import FallbackContract
from routing.models import Endpoint, Model, Provider
from tenants.keys import key_hash, key_matches, key_prefix
from tenants.models import ApiKey, App, Partner, Team, Tenant

pytestmark = pytest.mark.django_db

ENV = {"ALPHA_API_KEY": "alpha-secret-1", "BETA_API_KEY": "beta-secret-1", "GAMMA_API_KEY": "g"}


def config_version() -> int:
    raw = gateway_redis.sync_client().get(gateway_redis.key("config", "version"))
    return int(raw or 0)


def dump() -> dict[str, list[dict[str, Any]]]:
    """Every configuration row, every column."""
    return {
        kind: list(model._default_manager.order_by("pk").values()) for kind, model in KINDS.items()
    }


def write(tmp_path: Path, data: object, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def reference_data(reference_path: Path) -> dict[str, Any]:
    data = yaml.safe_load(reference_path.read_text())
    assert isinstance(data, dict)
    return data


def test_it_loads_the_reference_file(reference_path: Path, redis_prefix: str) -> None:
    summary = config_load(reference_path, env=ENV)

    counts = {kind: model._default_manager.count() for kind, model in KINDS.items()}
    assert counts == {
        "workload class": 4,
        "provider": 3,
        "provider project": 0,
        "provider key": 0,
        "model": 3,
        "endpoint": 6,
        "partner": 1,
        "tenant": 2,
        "team": 2,
        "app": 3,
        "api key": 3,
        "bucket": 16,
    }
    assert all(summary.count(kind, "created") == n for kind, n in counts.items())
    assert set(Bucket.objects.values_list("name", flat=True)) >= {
        "provider:alpha:requests:1m",
        "provider:alpha:requests:day",
        "provider:beta:ramp:1m",
        "provider:gamma:spend:rolling-5h",
        "partner:resellerco:concurrency",
        "tenant:acme:total_tokens:day",
        "app:acme/search/web:concurrency",
        "tenant:globex:requests:1m",
    }
    assert summary.warnings == []


def test_it_maps_every_field(reference_path: Path, redis_prefix: str) -> None:
    config_load(reference_path, env=ENV)

    daily = Bucket.objects.get(name="provider:alpha:requests:day")
    assert (daily.scope_kind, daily.provider.name, daily.rule, daily.capacity) == (
        "provider",
        "alpha",
        "fixed_window",
        200000,
    )
    assert (str(daily.resets_at), daily.timezone, daily.window) == (
        "00:00:00",
        "America/Los_Angeles",
        "day",
    )
    ramp = Bucket.objects.get(name="provider:beta:ramp:1m")
    assert (ramp.rule, ramp.factor, ramp.period_seconds, ramp.capacity) == ("ramp", 2.0, 60, None)
    spend = Bucket.objects.get(name="tenant:acme:spend:rolling-5h")
    assert (spend.rule, spend.duration_seconds, spend.tenant.name) == (
        "rolling_window",
        18000,
        "acme",
    )
    assert Bucket.objects.get(name="app:acme/search/web:concurrency").app.name == "web"
    assert set(Bucket.objects.values_list("source", flat=True)) == {"configured"}

    endpoints = Endpoint.objects.filter(model__slug="acme/chat-large").order_by("position")
    assert [(e.position, e.provider.name) for e in endpoints] == [
        (0, "alpha"),
        (1, "beta"),
        (2, "gamma"),
    ]
    assert str(endpoints[0].price_cached_input.normalize()) == "0.05"
    assert endpoints[0].supports == ["tools", "response_format", "stream"]
    background = WorkloadClass.objects.get(name="background")
    assert (background.deadline_seconds, background.overload_action) == (1800, "defer")
    # C10's default: a stream reserves its whole maximum output.
    assert (background.stream_reservation, background.stream_step_tokens) == ("max", 256)
    globex = Tenant.objects.get(name="globex")
    assert globex.partner == Partner.objects.get(name="resellerco")
    assert App.objects.get(name="indexer").default_workload.name == "background"


def test_it_learns_the_concurrency_of_providers_that_configure_none_unless_told_not_to(
    reference_path: Path, tmp_path: Path, redis_prefix: str
) -> None:
    data = reference_data(reference_path)
    [gamma] = [p for p in data["providers"] if p["name"] == "gamma"]
    gamma["learn_concurrency"] = False
    config_load(write(tmp_path, data), env=ENV)

    assert not Provider.objects.get(name="gamma").learn_concurrency
    learned = [
        b.spec.name
        for buckets in quota_snapshot_build().buckets.values()
        for b in buckets
        if b.spec.learned
    ]
    # alpha configures its concurrency (64), gamma is told not to learn: only beta learns.
    assert learned == ["provider:beta:concurrency:learned"]


def test_it_stores_key_secrets_as_hashes_that_authenticate(
    reference_path: Path, redis_prefix: str
) -> None:
    config_load(reference_path, env=ENV)
    secret = "sk-sy-test-acme-web-0001"

    candidates = ApiKey.objects.filter(prefix=key_prefix(secret))
    match = [k for k in candidates if key_matches(key_hash(secret), k.secret_hash)]

    assert [(k.app.name, k.tenant.name) for k in match] == [("web", "acme")]
    stored = list(ApiKey.objects.values_list("secret_hash", "prefix"))
    assert all(secret not in value for row in stored for value in row if len(value) > 12)


def test_it_encrypts_provider_credentials_from_the_environment(
    reference_path: Path, redis_prefix: str
) -> None:
    config_load(reference_path, env=ENV)

    alpha = Provider.objects.get(name="alpha")
    assert alpha.api_key_encrypted and "alpha-secret-1" not in alpha.api_key_encrypted
    assert alpha.get_api_key() == "alpha-secret-1"


def test_it_warns_and_stores_nothing_when_the_env_var_is_missing(
    reference_path: Path, redis_prefix: str
) -> None:
    summary = config_load(reference_path, env={"ALPHA_API_KEY": "a"})

    assert Provider.objects.get(name="beta").api_key_encrypted == ""
    assert [w.split(":")[0] for w in summary.warnings] == [
        "providers[1].api_key_env",
        "providers[2].api_key_env",
    ]
    assert "BETA_API_KEY is not set" in summary.warnings[0]


def test_it_keeps_a_stored_credential_when_the_env_var_is_missing_later(
    reference_path: Path, redis_prefix: str
) -> None:
    config_load(reference_path, env=ENV)

    config_load(reference_path, env={})

    assert Provider.objects.get(name="beta").get_api_key() == "beta-secret-1"


def test_it_changes_nothing_on_a_second_load(reference_path: Path, redis_prefix: str) -> None:
    config_load(reference_path, env=ENV)
    before = dump()

    summary = config_load(reference_path, env=ENV)

    assert dump() == before
    assert not summary.changed
    assert all(
        summary.count(kind, "created") + summary.count(kind, "updated") == 0 for kind in KINDS
    )
    assert summary.count("bucket", "unchanged") == 16


def test_it_loads_a_workload_class_whose_streams_reserve_in_increments(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    data = reference_data(reference_path)
    data["workload_classes"][0].update(stream_reservation="increments", stream_step_tokens=128)

    summary = config_load(write(tmp_path, data), env=ENV)

    assert summary.count("workload class", "updated") == 1
    interactive = WorkloadClass.objects.get(name="interactive")
    assert (interactive.stream_reservation, interactive.stream_step_tokens) == ("increments", 128)
    # The hot path reads it from the snapshot, never from the database.
    workloads = quota_snapshot_build().workloads
    assert workloads["interactive"].step_plan == StepPlan(step_tokens=128)
    assert workloads["background"].step_plan is None


def test_it_loads_a_workload_class_contract_into_the_snapshot(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    data = reference_data(reference_path)
    data["workload_classes"][0]["fallback_contract"] = {"regions": "same", "max_price_ratio": 1.2}

    config_load(write(tmp_path, data), env=ENV)

    interactive = WorkloadClass.objects.get(name="interactive")
    assert interactive.fallback_contract == {"regions": "same", "max_price_ratio": 1.2}
    workloads = quota_snapshot_build().workloads
    assert workloads["interactive"].contract == FallbackContract(
        same_region=True, max_price_ratio=1.2
    )
    assert workloads["background"].contract is None  # the route's contract alone


def test_it_updates_only_what_changed(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    data = reference_data(reference_path)
    data["providers"][1]["limits"][0]["capacity"] = 900
    data["workload_classes"][0]["deadline"] = "15s"
    data["providers"][0]["limits"].append({"dimension": "spend", "capacity": 5, "per": "1h"})
    before = dump()

    summary = config_load(write(tmp_path, data), env={**ENV, "GAMMA_API_KEY": "rotated"})

    assert (summary.count("bucket", "updated"), summary.count("bucket", "created")) == (1, 1)
    assert summary.count("workload class", "updated") == 1
    assert summary.count("provider", "updated") == 1  # gamma's credential
    assert Bucket.objects.get(name="provider:beta:requests:1m").capacity == 900
    assert Provider.objects.get(name="gamma").get_api_key() == "rotated"
    after = dump()
    assert after["api key"] == before["api key"]
    assert after["tenant"] == before["tenant"]


def test_it_leaves_objects_the_file_does_not_mention(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    Tenant.objects.create(name="initech")
    data = reference_data(reference_path)
    del data["tenants"][1]

    summary = config_load(write(tmp_path, data), env=ENV)

    assert set(Tenant.objects.values_list("name", flat=True)) == {"acme", "globex", "initech"}
    assert summary.left_alone["tenant"] == 2


def test_it_refers_to_objects_already_in_the_database(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    data = {
        "models": [
            {
                "slug": "acme/chat-tiny",
                "fallback_model": "acme/chat-small",
                "endpoints": [
                    {
                        "provider": "alpha",
                        "upstream_model": "tiny",
                        "price": {"input": 0.01, "output": 0.02},
                        "context_window": 8192,
                        "max_output": 1024,
                    }
                ],
            }
        ],
        "tenants": [
            {
                "name": "initech",
                "partner": "resellerco",
                "teams": [{"name": "ops", "apps": [{"name": "bot", "default_workload": "batch"}]}],
            }
        ],
    }

    config_load(write(tmp_path, data), env=ENV)

    tiny = Model.objects.get(slug="acme/chat-tiny")
    assert tiny.fallback_model.slug == "acme/chat-small"
    assert tiny.endpoints.get().price_cached_input == tiny.endpoints.get().price_input
    assert Tenant.objects.get(name="initech").partner.name == "resellerco"


def test_it_generates_a_secret_for_a_new_key_without_one_and_keeps_it(
    redis_prefix: str, tmp_path: Path
) -> None:
    data = {
        "tenants": [
            {
                "name": "t",
                "teams": [{"name": "x", "apps": [{"name": "a", "keys": [{"name": "k"}]}]}],
            }
        ]
    }
    path = write(tmp_path, data)

    first = config_load(path, env={})
    second = config_load(path, env={})

    [(key_path, secret)] = first.secrets
    assert key_path == "tenants[0].teams[0].apps[0].keys[0]"
    assert ApiKey.objects.get().secret_hash == key_hash(secret)
    assert second.secrets == [] and not second.changed


def test_it_changes_nothing_when_the_file_fails_late(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    """The error is only found while writing (a secret owned by a key outside the file), after
    every object of the reference file was already created in the transaction."""
    other = Tenant.objects.create(name="other")
    app = App.objects.create(team=Team.objects.create(tenant=other, name="t"), name="a")
    taken = "sk-sy-test-already-taken-0001"
    ApiKey.objects.create(app=app, name="k", secret_hash=key_hash(taken), prefix=key_prefix(taken))
    data = reference_data(reference_path)
    data["tenants"].append(
        {
            "name": "zeta",
            "teams": [
                {"name": "t", "apps": [{"name": "a", "keys": [{"name": "k", "secret": taken}]}]}
            ],
        }
    )
    before = dump()
    version = config_version()

    with pytest.raises(ConfigError) as raised:
        config_load(write(tmp_path, data), env=ENV)

    assert raised.value.errors == [
        "tenants[2].teams[0].apps[0].keys[0].secret: is already used by another key"
    ]
    assert dump() == before
    assert config_version() == version


def test_it_changes_nothing_when_validation_fails(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    data = reference_data(reference_path)
    data["tenants"][1]["teams"][0]["apps"][0]["default_workload"] = "partnr"
    before = dump()

    with pytest.raises(ConfigError):
        config_load(write(tmp_path, data), env=ENV)

    assert dump() == before


def test_it_bumps_the_config_version_after_a_change_only(
    reference_path: Path, redis_prefix: str, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        config_load(reference_path, env=ENV)
    assert len(callbacks) == 1
    assert config_version() == 1

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        config_load(reference_path, env=ENV)
    assert callbacks == []
    assert config_version() == 1


def test_it_rolls_a_dry_run_back(reference_path: Path, redis_prefix: str) -> None:
    summary = config_load(reference_path, env=ENV, dry_run=True)

    assert summary.count("bucket", "created") == 16
    assert all(model._default_manager.count() == 0 for model in KINDS.values())


def test_the_command_prints_a_summary_and_warnings(
    reference_path: Path, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALPHA_API_KEY", "from-the-environment")
    monkeypatch.delenv("BETA_API_KEY", raising=False)
    monkeypatch.setenv("GAMMA_API_KEY", "g")
    out, err = StringIO(), StringIO()

    call_command("loadconfig", str(reference_path), stdout=out, stderr=err)

    assert "bucket: 16 created, 0 updated, 0 unchanged" in out.getvalue()
    assert "BETA_API_KEY is not set" in err.getvalue()
    assert Provider.objects.get(name="alpha").get_api_key() == "from-the-environment"


def test_the_command_lists_every_error_and_fails(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    data = reference_data(reference_path)
    data["providers"][1]["limits"][2]["capacity"] = -5
    data["tenants"][0]["teams"][0]["apps"][1]["default_workload"] = "interactiv"

    with pytest.raises(CommandError) as raised:
        call_command("loadconfig", str(write(tmp_path, data)), stdout=StringIO())

    message = str(raised.value)
    assert "2 errors, nothing changed" in message
    assert "providers[1].limits[2].capacity: must be a positive number, got -5" in message
    assert (
        "tenants[0].teams[0].apps[1].default_workload: unknown workload class 'interactiv'"
        in message
    )
    assert Provider.objects.count() == 0


def test_the_command_dry_run_writes_nothing(reference_path: Path, redis_prefix: str) -> None:
    out = StringIO()

    call_command("loadconfig", str(reference_path), "--dry-run", stdout=out, stderr=StringIO())

    assert "dry run: nothing was written" in out.getvalue()
    assert Tenant.objects.count() == 0


def test_the_command_help_says_unmentioned_objects_are_left_alone() -> None:
    help_text = loadconfig.Command().create_parser("manage.py", "loadconfig").format_help()

    assert "the file does not mention are left alone" in " ".join(help_text.split())
    assert "--dry-run" in help_text


def test_the_command_reports_an_invalid_name_instead_of_crashing(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    data = reference_data(reference_path)
    data["tenants"][0]["teams"][0]["name"] = "search team"

    with pytest.raises(CommandError) as raised:
        call_command("loadconfig", str(write(tmp_path, data)), stdout=StringIO())

    message = str(raised.value)
    assert "nothing changed" in message
    assert "tenants[0].teams[0].name: must be" in message
    assert Tenant.objects.count() == 0


def test_it_loads_the_shared_example_unchanged(redis_prefix: str) -> None:
    # docs/examples/switchyard.yaml is ../shared/examples/switchyard.yaml byte for byte
    # (tests/simulator/test_market_parsing.py checks it where ../shared is at hand).
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "switchyard.yaml"

    config_load(example, env=ENV)

    assert Model.objects.filter(slug="acme/chat-large").exists()
    assert ApiKey.objects.count() >= 1


def test_it_loads_an_endpoints_batch_api_into_the_catalogue(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    data = reference_data(reference_path)
    data["models"][0]["endpoints"][1]["batch"] = {"discount": 0.4, "turnaround": "2h"}

    config_load(write(tmp_path, data), env=ENV)

    beta = Endpoint.objects.get(model__slug="acme/chat-large", provider__name="beta")
    assert (
        beta.batch_api,
        str(beta.batch_discount.normalize()),
        beta.batch_turnaround_seconds,
    ) == (
        True,
        "0.4",
        7200,
    )
    entries = {e.key: e for e in catalogue_build().endpoints.values()}
    assert (
        entries["acme/chat-large@beta"].batch_api,
        entries["acme/chat-large@beta"].batch_discount,
    ) == (True, 0.4)
    assert entries["acme/chat-large@alpha"].batch_api is False
    # Dropped from the file later: the endpoint no longer offers it.
    del data["models"][0]["endpoints"][1]["batch"]
    config_load(write(tmp_path, data), env=ENV)
    assert Endpoint.objects.get(pk=beta.pk).batch_api is False
