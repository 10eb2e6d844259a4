"""The pure part of loadconfig: parsing, validation messages, bucket names (no database)."""

from __future__ import annotations

import copy
import datetime as dt
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from common.durations import duration_format, duration_parse
from configfile import ConfigError, KnownNames, config_parse, config_read, schema
from configfile.scopes import scoped_limits
from quotas import limits
from quotas.names import bucket_name

REFERENCE = Path(__file__).resolve().parents[2] / "config" / "switchyard.yaml"


def reference() -> dict[str, Any]:
    data = config_read(REFERENCE)
    assert isinstance(data, dict)
    return data


def errors_of(data: object, known: KnownNames | None = None) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        config_parse(data, known=known)
    return raised.value.errors


def test_it_parses_the_reference_file() -> None:
    config = config_parse(reference())

    assert [p.name for p in config.providers] == ["alpha", "beta", "gamma"]
    assert [e.provider for e in config.models[0].endpoints] == ["alpha", "beta", "gamma"]
    assert config.models[0].endpoints[0].price.cached_input == Decimal("0.05")
    interactive = config.workload_classes[0]
    assert (interactive.name, interactive.deadline_seconds) == ("interactive", 10.0)
    assert config.workload_classes[3].deadline_seconds == 24 * 3600
    daily = config.providers[0].limits[3]
    assert daily.rule == "fixed_window"
    assert (daily.window, daily.resets_at, daily.timezone) == (
        "day",
        dt.time(0, 0),
        "America/Los_Angeles",
    )
    assert config.providers[1].limits[3].rule == "ramp"
    assert config.providers[2].limits[1].duration_seconds == 5 * 3600


def test_it_reads_routing_overrides_and_quality_flags() -> None:
    data = reference()
    data["models"][0]["routing"] = {"band": 0.2, "time_value": 0.8}
    data["models"][0]["default_input_tokens"] = 2500
    data["models"][0]["endpoints"][2]["quality_flagged"] = True

    model = config_parse(data).models[0]

    assert model.routing == {"band": 0.2, "time_value": 0.8}
    assert model.default_input_tokens == 2500
    assert [e.quality_flagged for e in model.endpoints] == [False, False, True]


def test_it_reads_the_cost_guards_bound_exactly_and_leaves_an_unstated_one_to_the_default() -> None:
    data = reference()
    data["models"][0]["max_cost_premium"] = 0.1

    models = config_parse(data).models

    assert models[0].max_cost_premium == Decimal("0.1")
    assert models[1].max_cost_premium is None  # the default guards (routing/core/guards.py)


def test_it_refuses_a_negative_cost_guard_bound_by_its_path() -> None:
    data = reference()
    data["models"][1]["max_cost_premium"] = -0.02

    with pytest.raises(ConfigError) as caught:
        config_parse(data)

    assert "models[1].max_cost_premium" in str(caught.value)


def test_it_names_buckets_by_their_own_scope() -> None:
    names = [bucket_name(scope, limit) for scope, limit in scoped_limits(config_parse(reference()))]

    assert names == [
        "provider:alpha:requests:1m",
        "provider:alpha:input_tokens:1m",
        "provider:alpha:output_tokens:1m",
        "provider:alpha:requests:day",
        "provider:alpha:concurrency",
        "provider:beta:requests:1m",
        "provider:beta:input_tokens:1m",
        "provider:beta:output_tokens:1m",
        "provider:beta:ramp:1m",
        "provider:gamma:requests:1m",
        "provider:gamma:spend:rolling-5h",
        "partner:resellerco:concurrency",
        "tenant:acme:total_tokens:day",
        "tenant:acme:spend:rolling-5h",
        "app:acme/search/web:concurrency",
        "tenant:globex:requests:1m",
    ]


def test_it_names_equal_durations_alike_and_marks_shadow_limits() -> None:
    data = {
        "partners": [
            {
                "name": "p",
                "limits": [
                    {"dimension": "requests", "capacity": 1, "per": "60s"},
                    {"dimension": "requests", "capacity": 2, "per": "1m", "shadow": True},
                    {"dimension": "spend", "capacity": 3, "per": "1m", "name": "spend-minute"},
                ],
            }
        ]
    }
    config = config_parse(data)

    names = [bucket_name(scope, limit) for scope, limit in scoped_limits(config)]
    assert names == [
        "partner:p:requests:1m",
        "partner:p:requests:1m:shadow",
        "partner:p:spend-minute",
    ]


def _edit(path: str, value: object) -> dict[str, Any]:
    """The reference file with the value at ``path`` (dotted, [i] for items) replaced."""
    data = reference()
    target: Any = data
    steps = path.replace("[", ".").replace("]", "").split(".")
    for step in steps[:-1]:
        target = target[int(step)] if step.isdigit() else target[step]
    last = steps[-1]
    if value is _DELETE:
        del target[int(last) if last.isdigit() else last]
    elif last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return data


_DELETE = object()

INVALID = [
    (
        "models[0].routing",
        {"bandd": 0.2},
        "models[0].routing: RoutingParameters.__init__() got an unexpected keyword argument "
        "'bandd' (known: ",
    ),
    ("models[0].routing", {"band": "wide"}, "models[0].routing.band: must be a number, got 'wide'"),
    (
        "providers[1].limits[2].capacity",
        -5,
        "providers[1].limits[2].capacity: must be a positive number, got -5",
    ),
    (
        "tenants[0].teams[0].apps[1].default_workload",
        "interactiv",
        "tenants[0].teams[0].apps[1].default_workload: unknown workload class 'interactiv' "
        "(known: background, batch, interactive, partner)",
    ),
    (
        "models[0].endpoints[2].provider",
        "delta",
        "models[0].endpoints[2].provider: unknown provider 'delta' (known: alpha, beta, gamma)",
    ),
    ("tenants[1].partner", "nobody", "tenants[1].partner: unknown partner 'nobody'"),
    (
        "providers[0].limits[3].timezone",
        "Mars/Olympus",
        "providers[0].limits[3].timezone: unknown time zone 'Mars/Olympus'",
    ),
    (
        "providers[0].limits[3].resets_at",
        750,  # what YAML makes of an unquoted 12:30
        'providers[0].limits[3].resets_at: must be a time "HH:MM" in quotes',
    ),
    (
        "providers[0].limits[3].resets_at",
        "24:00",
        "resets_at: must be a time \"HH:MM\", got '24:00'",
    ),
    (
        "providers[0].limits[4].per",
        "1m",
        "providers[0].limits[4].per: is not allowed for a concurrency limit",
    ),
    ("providers[1].limits[3].factor", _DELETE, "providers[1].limits[3].factor: is required"),
    ("providers[1].limits[3].factor", 0.5, "factor: must be a growth factor greater than 1"),
    (
        "providers[0].limits[0].dimension",
        "tokens",
        "providers[0].limits[0].dimension: must be one of requests, input_tokens",
    ),
    ("providers[0].limits[0].per", "60", "per: must be a duration such as 500ms, 10s, 1m"),
    ("workload_classes[0].deadline", "soon", "workload_classes[0].deadline: must be a duration"),
    ("workload_classes[1].overload", "drop", "overload: must be one of reject, degrade, defer"),
    (
        "workload_classes[0].stream_reservation",
        "steps",
        "workload_classes[0].stream_reservation: must be one of max, increments, got 'steps'",
    ),
    (
        "workload_classes[0].stream_step_tokens",
        0,
        "workload_classes[0].stream_step_tokens: must be a positive whole number, got 0",
    ),
    ("providers[0].protocol", "grpc", "providers[0].protocol: must be one of openai, anthropic"),
    ("providers[0].base_url", "localhost:9101", "providers[0].base_url: must be an http(s) URL"),
    (
        "models[1].endpoints[0].price",
        {"input": 0.1},
        "models[1].endpoints[0].price.output: is required",
    ),
    ("models[1].endpoints[0].supports", ["tool"], "endpoints[0].supports[0]: must be one of tools"),
    ("tenants[0].teams[0].apps[0].environment", "prod", "apps[0].environment: must be one of"),
    ("tenants[0].teams[0].apps[0].keys[0].secret", "hunter2", "keys[0].secret: must start with"),
    ("tenants[1].weight", 0, "tenants[1].weight: must be a positive number, got 0"),
    (
        "providers[2].name",
        "alpha",
        "providers[2].name: duplicate provider 'alpha' (also providers[0])",
    ),
    ("tenants[0].teams[0].apps[1].name", "web", "apps[1].name: duplicate app 'web'"),
    (
        "models[0].endpoints[1].provider",
        "alpha",
        "endpoints[1].provider: duplicate endpoint provider",
    ),
    (
        "tenants[1].teams[0].apps[0].keys[0].secret",
        "sk-sy-test-acme-web-0001",
        "tenants[1].teams[0].apps[0].keys[0].secret: is the same as tenants[0].teams[0].apps[0].keys[0].secret",
    ),
    (
        "providers[0].limits[1]",
        {"dimension": "requests", "capacity": 7, "per": "60s"},
        "providers[0].limits[1]: bucket name 'provider:alpha:requests:1m' is also used by "
        "providers[0].limits[0]",
    ),
    (
        "providers[0].limits[0]",
        {"dimension": "requests", "capacity": 5},
        "providers[0].limits[0]: a requests limit needs 'per'",
    ),
    (
        "providers[0].limits[0]",
        {"dimension": "requests", "capacity": 5, "per": "1m", "window": "day"},
        "give either 'per' (refill) or 'window' (fixed or rolling), not both",
    ),
    (
        "providers[2].limits[1].duration",
        _DELETE,
        "providers[2].limits[1].duration: is required for a rolling window limit",
    ),
    ("models[0].slug", "acme/chat:large", "models[0].slug: must be a model id"),
    (
        "tenants[0].teams[0].apps[0].keys[0].allowed_models",
        ["acme/nope"],
        "allowed_models[0]: unknown model",
    ),
    (
        "tenants[0].teams[0].apps[0].keys[0].expires_at",
        "2027-01-01T00:00:00",
        "must include a time zone",
    ),
    ("models[0].endpoints[0].max_output", 200000, "max_output: must not exceed context_window"),
    ("tenants", {"name": "acme"}, "tenants: must be a list, got a mapping"),
]


@pytest.mark.parametrize(("path", "value", "fragment"), INVALID, ids=[i[0] for i in INVALID])
def test_it_refuses_an_invalid_file_naming_the_field(
    path: str, value: object, fragment: str
) -> None:
    errors = errors_of(_edit(path, value))

    assert any(fragment in error for error in errors), errors


def test_it_reports_unknown_keys_with_a_suggestion() -> None:
    data = reference()
    data["providers"][0]["api_kye_env"] = data["providers"][0].pop("api_key_env")
    data["tenants"][0]["teams"][0]["apps"][0]["limits"][0]["shaddow"] = True
    data["routes"] = []

    errors = errors_of(data)

    assert errors[0].startswith(
        "providers[0].api_kye_env: unknown key (did you mean 'api_key_env'?"
    )
    assert any(
        e.startswith("tenants[0].teams[0].apps[0].limits[0].shaddow: unknown key") for e in errors
    )
    assert any(e.startswith("routes: unknown key (known: models, partners,") for e in errors)


def test_it_reports_every_error_not_only_the_first() -> None:
    data = _edit("providers[1].limits[2].capacity", -5)
    data["tenants"][0]["teams"][0]["apps"][1]["default_workload"] = "interactiv"
    data["workload_classes"][0]["retry_budget"] = -1

    errors = errors_of(data)

    assert len(errors) == 3
    assert [e.split(":")[0] for e in errors] == [
        "providers[1].limits[2].capacity",
        "workload_classes[0].retry_budget",
        "tenants[0].teams[0].apps[1].default_workload",
    ]


def test_it_accepts_references_to_names_already_in_the_database() -> None:
    data = _edit("models[0].endpoints[2].provider", "delta")
    data["tenants"][1]["partner"] = "otherco"

    config = config_parse(
        data, known=KnownNames(providers=frozenset({"delta"}), partners=frozenset({"otherco"}))
    )

    assert config.models[0].endpoints[2].provider == "delta"


def test_it_refuses_a_key_given_twice_in_one_mapping(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text("partners:\n  - name: a\n    name: b\n")

    with pytest.raises(ConfigError, match="duplicate key 'name'"):
        config_read(path)


def test_it_reads_an_empty_file_as_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")

    assert errors_of(config_read(path)) == ["(file): must be a mapping, got nothing"]


def test_it_fills_defaults_for_optional_fields() -> None:
    data = yaml.safe_load(
        """
        tenants:
          - name: t
            teams: [{name: x, apps: [{name: a, keys: [{name: k, expires_at: 2027-01-01}]}]}]
        partners:
          - name: p
            limits: [{dimension: total_tokens, capacity: 9, window: day}]
        """
    )
    config = config_parse(data)

    app = config.tenants[0].teams[0].apps[0]
    assert (app.environment, app.default_workload, app.keys[0].secret) == ("production", "", "")
    assert app.keys[0].expires_at == dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    limit = config.partners[0].limits[0]
    assert (limit.resets_at, limit.timezone) == (dt.time(0, 0), "UTC")


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["ms", "s", "m", "h", "d"]))
def test_it_formats_durations_so_they_parse_back(count: int, unit: str) -> None:
    seconds = duration_parse(f"{count}{unit}")

    assert seconds is not None
    assert duration_parse(duration_format(seconds)) == pytest.approx(seconds)


def test_it_formats_durations_in_the_largest_exact_unit() -> None:
    assert [duration_format(s) for s in (0.5, 10, 60, 90, 3600, 5 * 3600, 86400)] == [
        "500ms",
        "10s",
        "1m",
        "90s",
        "1h",
        "5h",
        "1d",
    ]


def test_it_keeps_the_schema_words_in_step_with_the_models() -> None:
    from quotas.models import Bucket, WorkloadClass
    from routing.models import Provider
    from tenants.models import App, Tenant

    assert set(limits.DIMENSIONS) == set(Bucket.Dimension.values)
    assert set(limits.RULES) == set(Bucket.Rule.values)
    assert set(limits.FIXED_WINDOWS) == set(Bucket.Window.values)
    assert set(schema.PROTOCOLS) == set(Provider.Protocol.values)
    assert set(schema.OVERLOAD_ACTIONS) == set(WorkloadClass.Overload.values)
    assert set(schema.STREAM_RESERVATIONS) == set(WorkloadClass.StreamReservation.values)
    assert set(schema.ENVIRONMENTS) == set(App.Environment.values)
    assert {"" if s == "routing_cost" else s for s in schema.SORTS} == set(Tenant.Sort.values)


def test_it_reads_how_a_workload_classs_streams_reserve_their_output() -> None:
    data = reference()
    data["workload_classes"][0].update(stream_reservation="increments", stream_step_tokens=64)
    config = config_parse(data)
    first, second = config.workload_classes[:2]
    assert (first.stream_reservation, first.stream_step_tokens) == ("increments", 64)
    # Not given: the whole maximum, as before (C10's default), and the core's step size.
    assert (second.stream_reservation, second.stream_step_tokens) == ("max", 256)


def test_it_parses_without_importing_the_orm() -> None:
    code = (
        "import sys, gateway; before = set(sys.modules);"
        "import configfile, quotas.names, configfile.validate;"
        "new = set(sys.modules) - before;"
        "bad = sorted(m for m in new if m.split('.')[0] in ('django', 'redis'));"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REFERENCE.parents[1])


def test_it_does_not_change_its_input() -> None:
    data = reference()
    before = copy.deepcopy(data)

    config_parse(data)

    assert data == before


# A refused name is left as None by the schema; the checks across the file must skip it, not
# crash on it (they used to end in a TypeError traceback from ``scope_name``).
BAD_NAMES = [
    ("tenants[0].name", "Acme Corp"),
    ("tenants[0].name", "a" * 101),
    ("tenants[0].teams[0].name", "search team"),
    ("tenants[0].teams[0].apps[0].name", "web app"),
    ("tenants[0].teams[0].apps[0].keys[0].name", "k" * 300),
    ("providers[0].name", "Alpha Corp"),
    ("partners[0].name", "Reseller Co"),
    ("models[0].slug", "acme/chat large"),
]


@pytest.mark.parametrize(("path", "value"), BAD_NAMES, ids=[f"{p}={v[:12]}" for p, v in BAD_NAMES])
def test_it_reports_an_invalid_name_with_its_path(path: str, value: str) -> None:
    errors = errors_of(_edit(path, value))

    assert any(error.startswith(f"{path}: ") for error in errors), errors


def test_it_reads_a_fallback_contract_and_region_tags() -> None:
    data = reference()
    data["models"][0]["fallback_contract"] = {"regions": "same", "max_price_ratio": 1.5}
    data["models"][0]["endpoints"][0]["region"] = "eu"

    models = config_parse(data).models

    assert models[0].fallback_contract == {"regions": "same", "max_price_ratio": 1.5}
    assert [e.region for e in models[0].endpoints] == ["eu", "", ""]
    assert models[1].fallback_contract == {}  # no contract: any fallback, as before


FALLBACK_CONTRACT_INVALID = [
    ({"region": "same"}, "models[0].fallback_contract: unknown clause 'region'"),
    ({"regions": "eu"}, "models[0].fallback_contract: regions: must be 'same' or a list"),
    ({"regions": ["EU!"]}, "models[0].fallback_contract.regions[0]: must be a region tag"),
    ({"max_price_ratio": 0.5}, "models[0].fallback_contract: max_price_ratio: must be a number"),
    ({"providers": "alpha"}, "models[0].fallback_contract: providers: must be a non-empty list"),
    ({"context": "bigger"}, "models[0].fallback_contract: context: must be one of any"),
    ("strict", "models[0].fallback_contract: must be a mapping of contract clauses"),
]


@pytest.mark.parametrize(("value", "fragment"), FALLBACK_CONTRACT_INVALID)
def test_it_refuses_a_bad_fallback_contract_naming_the_clause(value: object, fragment: str) -> None:
    errors = errors_of(_edit("models[0].fallback_contract", value))

    assert any(fragment in error for error in errors), errors


@pytest.mark.parametrize("value", ["Europe West", 7, "x" * 41])
def test_it_refuses_a_bad_region_tag_by_its_path(value: object) -> None:
    errors = errors_of(_edit("models[0].endpoints[1].region", value))

    assert any("models[0].endpoints[1].region: must be a region tag" in e for e in errors), errors


def test_it_refuses_an_unknown_provider_in_a_fallback_contract() -> None:
    errors = errors_of(_edit("models[0].fallback_contract", {"providers": ["alpha", "btea"]}))

    assert any(
        "models[0].fallback_contract.providers[1]: unknown provider 'btea'" in e for e in errors
    ), errors


def test_it_reads_a_workload_class_contract_and_checks_its_clauses_and_providers() -> None:
    data = reference()
    data["workload_classes"][0]["fallback_contract"] = {"regions": "same"}

    assert config_parse(data).workload_classes[0].fallback_contract == {"regions": "same"}
    assert config_parse(data).workload_classes[1].fallback_contract == {}
    bad_clause = errors_of(_edit("workload_classes[0].fallback_contract", {"region": "same"}))
    assert any(
        "workload_classes[0].fallback_contract: unknown clause 'region'" in e for e in bad_clause
    ), bad_clause
    misspelt = errors_of(_edit("workload_classes[1].fallback_contract", {"providers": ["btea"]}))
    assert any(
        "workload_classes[1].fallback_contract.providers[0]: unknown provider 'btea'" in e
        for e in misspelt
    ), misspelt


def test_it_reads_an_endpoints_batch_api() -> None:
    data = reference()
    data["models"][0]["endpoints"][1]["batch"] = {"discount": 0.4, "turnaround": "2h"}
    data["models"][0]["endpoints"][2]["batch"] = {}

    endpoints = config_parse(data).models[0].endpoints

    assert endpoints[0].batch is None  # no batch API unless the endpoint says so
    assert endpoints[1].batch == schema.BatchApiSpec(discount=Decimal("0.4"), turnaround=7200.0)
    # An empty section: the provider's usual terms, half price within a day.
    assert endpoints[2].batch == schema.BatchApiSpec(discount=Decimal("0.5"), turnaround=86400.0)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"discount": 1}, "models[0].endpoints[0].batch.discount: must be a share from 0"),
        ({"discount": "half"}, "models[0].endpoints[0].batch.discount: must be a share from 0"),
        ({"turnaround": 30}, "models[0].endpoints[0].batch.turnaround: must be a duration"),
        ({"window": "1h"}, "models[0].endpoints[0].batch.window"),
        (True, "models[0].endpoints[0].batch: must be a mapping"),
    ],
)
def test_it_refuses_a_bad_batch_api_by_its_path(value: object, fragment: str) -> None:
    errors = errors_of(_edit("models[0].endpoints[0].batch", value))

    assert any(fragment in error for error in errors), errors
