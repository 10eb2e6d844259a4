"""``loadconfig --prune``: the file is the source of truth for the sections it contains."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from configfile import ConfigError
from configfile.apply import config_load
from gateway.models import Generation
from quotas.models import Bucket, WorkloadClass
from routing.models import Endpoint, Model, Provider
from tenants.models import ApiKey, App, Partner, Team, Tenant
from tests.config.test_config_load import ENV, config_version, dump, reference_data, write

pytestmark = pytest.mark.django_db


def _key(path: str) -> ApiKey:
    tenant, team, app, name = path.split("/")
    return ApiKey.objects.get(
        app__team__tenant__name=tenant, app__team__name=team, app__name=app, name=name
    )


def _trimmed(reference_path: Path) -> dict[str, Any]:
    """The reference file minus an endpoint, a limit, a key, an app and a tenant."""
    data = reference_data(reference_path)
    data["models"][1]["endpoints"] = []
    del data["tenants"][0]["limits"][1]  # acme's spend limit
    data["tenants"][0]["teams"][0]["apps"][0]["keys"] = []  # acme/search/web/ci
    del data["tenants"][0]["teams"][0]["apps"][1]  # acme/search/indexer
    del data["tenants"][1]  # globex
    del data["workload_classes"][3]  # batch: no app uses it
    return data


def test_it_removes_what_the_file_no_longer_names(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    scratch = App.objects.create(team=Team.objects.get(name="search"), name="scratch")
    Tenant.objects.create(name="initech")  # made in the admin, never in the file

    summary = config_load(write(tmp_path, _trimmed(reference_path)), env=ENV, prune=True)

    assert not Endpoint.objects.filter(model__slug="acme/chat-small").exists()
    assert not Bucket.objects.filter(name="tenant:acme:spend:rolling-5h").exists()
    assert Bucket.objects.filter(name="tenant:acme:total_tokens:day").exists()
    # Keys are revoked, never deleted: the ledger refers to them.
    for path in ("acme/search/web/ci", "acme/search/indexer/ci", "globex/default/assistant/ci"):
        assert _key(path).revoked_at is not None
    assert not App.objects.filter(pk=scratch.pk).exists()
    assert not Tenant.objects.filter(name="initech").exists()
    # Apps, teams and tenants with keys are kept; the tenant is deactivated, its limits gone.
    assert App.objects.filter(name="indexer").exists()
    globex = Tenant.objects.get(name="globex")
    assert not globex.is_active
    assert not Bucket.objects.filter(scope_kind="tenant", tenant=globex).exists()
    assert not WorkloadClass.objects.filter(name="batch").exists()
    lines = {removal.line() for removal in summary.removals}
    assert "api key acme/search/web/ci: revoked" in lines
    assert "endpoint acme/chat-small@gamma: deleted" in lines
    assert "tenant initech: deleted" in lines
    assert any(line.startswith("tenant globex: deactivated (") for line in lines)


def test_it_changes_nothing_on_a_second_prune(
    reference_path: Path,
    redis_prefix: str,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    config_load(reference_path, env=ENV)
    path = write(tmp_path, _trimmed(reference_path))
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        first = config_load(path, env=ENV, prune=True)
    assert first.changed and len(callbacks) == 1  # one version bump for apply and prune
    version, before = config_version(), dump()

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        second = config_load(path, env=ENV, prune=True)

    assert dump() == before
    assert not second.changed and callbacks == []
    assert config_version() == version
    assert all(not removal.changed for removal in second.removals)


def test_it_bumps_the_version_when_only_pruning_changed_something(
    reference_path: Path,
    redis_prefix: str,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    config_load(reference_path, env=ENV)
    data = reference_data(reference_path)
    del data["providers"][0]["limits"][4]  # alpha's concurrency
    version = config_version()

    with django_capture_on_commit_callbacks(execute=True):
        summary = config_load(write(tmp_path, data), env=ENV, prune=True)

    assert summary.changed
    assert not Bucket.objects.filter(name="provider:alpha:concurrency").exists()
    assert config_version() == version + 1


def test_it_leaves_sections_the_file_does_not_contain(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    data = {"tenants": reference_data(reference_path)["tenants"][:1]}

    config_load(write(tmp_path, data), env=ENV, prune=True)

    assert Provider.objects.count() == 3 and Endpoint.objects.count() == 6
    assert Partner.objects.filter(name="resellerco").exists()
    assert Bucket.objects.filter(name="partner:resellerco:concurrency").exists()
    assert WorkloadClass.objects.count() == 4
    assert _key("globex/default/assistant/ci").revoked_at is not None


def test_it_deactivates_a_provider_that_endpoints_still_use(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    data = {"providers": reference_data(reference_path)["providers"][:2]}  # no gamma

    summary = config_load(write(tmp_path, data), env=ENV, prune=True)

    gamma = Provider.objects.get(name="gamma")
    assert not gamma.is_active
    assert not Bucket.objects.filter(provider=gamma).exists()
    lines = [removal.line() for removal in summary.removals]
    assert (
        "provider gamma: deactivated (endpoints of models acme/chat-large, acme/chat-small "
        "use it)" in lines
    )


def test_it_deactivates_a_model_a_live_key_may_use_and_deletes_the_others(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    ApiKey.objects.filter(name="ci", app__name="web").update(allowed_models=["acme/chat-large"])
    Model.objects.create(slug="acme/unused")
    data = reference_data(reference_path)
    data = {"models": data["models"][1:]}  # no acme/chat-large; tenants not managed

    config_load(write(tmp_path, data), env=ENV, prune=True)

    assert not Model.objects.get(slug="acme/chat-large").is_active
    assert not Endpoint.objects.filter(model__slug="acme/chat-large").exists()
    assert not Model.objects.filter(slug="acme/unused").exists()


def test_it_keeps_an_app_that_ledger_rows_refer_to(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    team = Team.objects.get(name="search")
    old = App.objects.create(team=team, name="old")
    Generation.objects.create(
        id="gen-1", tenant_id=team.tenant_id, app_id=old.pk, model="m", status=200
    )

    summary = config_load(reference_path, env=ENV, prune=True)

    assert App.objects.filter(pk=old.pk).exists()
    assert [r.line() for r in summary.removals] == [
        "app acme/search/old: kept (ledger rows refer to it; keys are never deleted)"
    ]
    assert not summary.changed


def test_it_refuses_a_reference_to_what_it_would_prune(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    data = reference_data(reference_path)
    del data["workload_classes"][0]  # interactive, still named by acme/search/web
    path = write(tmp_path, data)

    with pytest.raises(ConfigError) as raised:
        config_load(path, env=ENV, prune=True)

    assert any("unknown workload class 'interactive'" in e for e in raised.value.errors)
    config_load(path, env=ENV)  # without --prune the database's class may still be named


def test_it_never_prunes_learned_limits(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    beta = Provider.objects.get(name="beta")
    Bucket.objects.create(
        name="provider:beta:concurrency",
        scope_kind="provider",
        provider=beta,
        dimension="concurrency",
        rule="concurrency",
        capacity=8,
        source=Bucket.Source.LEARNED,
    )

    config_load(reference_path, env=ENV, prune=True)

    assert Bucket.objects.filter(name="provider:beta:concurrency").exists()


def test_the_command_lists_what_prune_would_remove_and_a_dry_run_keeps_it(
    reference_path: Path, redis_prefix: str, tmp_path: Path
) -> None:
    config_load(reference_path, env=ENV)
    path = str(write(tmp_path, _trimmed(reference_path)))
    before = dump()

    out = StringIO()
    call_command("loadconfig", path, stdout=out, stderr=StringIO())
    assert "in the database and not in the file, left alone (--prune removes them):" in (
        out.getvalue()
    )
    assert "  api key acme/search/web/ci" in out.getvalue()
    assert dump() == before

    out = StringIO()
    call_command("loadconfig", path, "--prune", "--dry-run", stdout=out, stderr=StringIO())
    assert "pruned api key acme/search/web/ci: revoked" in out.getvalue()
    assert "dry run: nothing was written" in out.getvalue()
    assert dump() == before

    out = StringIO()
    call_command("loadconfig", path, "--prune", stdout=out, stderr=StringIO())
    assert f"{path}: applied" in out.getvalue()
    assert _key("acme/search/web/ci").revoked_at is not None


def test_the_command_help_explains_prune() -> None:
    from configfile.management.commands import loadconfig

    help_text = " ".join(
        loadconfig.Command().create_parser("manage.py", "loadconfig").format_help().split()
    )
    assert "--prune" in help_text
    assert "API keys are revoked, never deleted" in help_text
