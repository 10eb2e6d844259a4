"""The switchback experiment end to end: determinism, A/A, direction of effects, the command."""

from __future__ import annotations

import json
from collections import Counter
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from simulator.switchback.experiment import Options, Run, experiment_run
from simulator.switchback.report import capacity_warning

from .helpers import REFERENCE_MARKET, SATURATED_MARKET
from .switchback_fixtures import CONFIG, MARKET, files

REFERENCE_CONFIG = REFERENCE_MARKET.parent / "switchyard.yaml"
HEADLINE = ("ttft_change", "throughput_change", "rate_limit_change", "cost_change", "error_change")


@pytest.fixture(scope="module")
def market_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return files(tmp_path_factory.mktemp("switchback"))


def estimates(result: dict) -> dict[str, dict]:
    return {"overall": result["overall"], **result["per_model"]}


def gamma_share(run: Run, model: str, arm: str) -> float:
    """Share of ``model``'s answers served by gamma in the measured part of ``arm``'s blocks."""
    design, served = run.design, Counter()
    for (time_bin, endpoint), n in run.shares.items():
        if not endpoint.startswith(model + "@"):
            continue
        start = time_bin * 900.0
        block = int(start // design.block_s)
        if start - block * design.block_s < design.warmup_s or block >= 2 * design.pairs:
            continue
        if run.arms_of_blocks.get(block) == arm:
            served[endpoint.endswith("@gamma")] += n
    return served[True] / (served[True] + served[False])


def test_it_gives_identical_json_for_two_runs(market_files):
    config, market = market_files
    first = experiment_run(Options(config, market, days=0.5))
    second = experiment_run(Options(config, market, days=0.5))
    assert json.dumps(first.result, sort_keys=True) == json.dumps(second.result, sort_keys=True)
    assert first.result["experiment"]["pairs"] == 6


def test_it_finds_no_difference_between_a_router_and_itself(market_files):
    config, market = market_files
    run = experiment_run(Options(config, market, days=2, arms=("routing_cost", "routing_cost")))
    assert run.result["experiment"]["pairs"] == 24
    for scope, estimate in estimates(run.result).items():
        for name in HEADLINE:
            lo, hi = estimate["ci"][name]
            assert lo <= 0.0 <= hi, (scope, name, lo, hi)


def test_it_shows_the_router_beating_price_only_where_capacity_allows(market_files):
    config, market = market_files
    result = experiment_run(Options(config, market)).result
    assert capacity_warning(result) is None  # most requests find capacity: ranking matters
    overall = result["overall"]
    # A cheap, slow, flaky endpoint short of capacity: the price-only router overloads it.
    assert overall["ttft_change"] < -0.1 and overall["ci"]["ttft_change"][1] < 0
    assert overall["throughput_change"] > 0.1 and overall["ci"]["throughput_change"][0] > 0
    assert overall["rate_limit_change"] < -0.5
    assert overall["error_change"] < 0
    assert overall["cost_change"] < 0.1


def test_it_runs_a_scaled_down_day_of_the_saturated_market_quickly():
    # "Quickly": the suite prints its duration (--durations); speed targets live in bench/.
    run = experiment_run(Options(str(REFERENCE_CONFIG), str(SATURATED_MARKET), days=1, scale=0.1))
    result = run.result
    assert set(result) == {"overall", "per_model", "experiment", "tallies"}
    assert set(result["per_model"]) == {"acme/chat-large", "acme/chat-small"}
    for estimate in estimates(result).values():
        assert set(HEADLINE) <= set(estimate) and set(HEADLINE) <= set(estimate["ci"])
    assert result["experiment"]["pairs"] == 4
    # Robust at any scale: the new router keeps chat-large off gamma (slow, 3 % errors) and
    # so meets fewer provider errors on chat-large. (TTFT, throughput and 429s of this
    # capacity-bound market need the full week — see bench/results/switchback.md; so do the
    # errors of both models together, which the shadow prices raise by serving more
    # chat-small at gamma: +14.7 % [+3.4, +27.2] over the week.)
    large = "acme/chat-large"
    assert gamma_share(run, large, "routing_cost") < gamma_share(run, large, "price_only")
    assert result["per_model"][large]["error_change"] < 0
    # Under half of the requests are served in either arm: the run says so.
    assert "capacity-bound" in (capacity_warning(result) or "")


def test_it_compares_streams_in_steps_with_reserve_max_on_one_router(market_files):
    config, market = market_files
    options = Options(
        config,
        market,
        days=0.5,
        arms=("routing_cost", "routing_cost"),
        stream_reservation=("increments", "max"),
    )
    result = experiment_run(options).result
    assert result["experiment"]["stream_reservation"] == {"new": "increments", "old": "max"}
    overall = result["overall"]
    # Only the arm in steps takes steps; it holds far less output beyond what answers make.
    assert overall["new"]["steps_granted"] > 0 and overall["old"]["steps_granted"] == 0
    assert overall["over_reserved_change"] < -0.5
    assert overall["ci"]["over_reserved_change"][1] < 0
    served = {arm: sum(n for what, n in t.items() if what.startswith("answers:"))
              for arm, t in result["tallies"].items()}  # fmt: skip
    assert served["new"] == round(overall["new"]["served"] * overall["new"]["requests"])
    with pytest.raises(CommandError, match="two of max, increments"):
        call_command(
            "switchback", "--config", config, "--market", market, "--pure",
            "--stream-reservation", "increments",
        )  # fmt: skip


def test_it_writes_json_plots_and_a_report(market_files, tmp_path: Path):
    config, market = market_files
    out = StringIO()
    call_command(
        "switchback",
        "--config", config, "--market", market, "--days", "0.5",
        "--json", str(tmp_path / "result.json"),
        "--plots", str(tmp_path / "plots"),
        "--report", str(tmp_path / "report.md"),
        "--no-progress",
        "--pure",  # the compiled build has its own test (test_switchback_compiled)
        stdout=out,
    )  # fmt: skip
    result = json.loads((tmp_path / "result.json").read_text())
    assert {"ttft_change", "throughput_change", "rate_limit_change", "cost_change", "ci"} <= set(
        result["overall"]
    )
    for name in ("shares.png", "blocks.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 10_000
    report = (tmp_path / "report.md").read_text()
    assert "python manage.py switchback" in report and "| TTFT p50 (s) |" in report
    assert "plots/shares.png" in report
    assert out.getvalue().startswith("overall: ttft_change")


def test_it_runs_the_router_with_each_models_routing_parameters_or_those_given(tmp_path: Path):
    """A model's ``routing`` in the config applies as in the gateway; ``--param`` for all."""

    def run(directory: str, config: str, *params: str) -> dict:
        config_path, market = files(tmp_path / directory, config=config)
        out = tmp_path / directory / "r.json"
        call_command(
            "switchback", "--config", config_path, "--market", market, "--days", "0.25",
            "--json", str(out), "--no-progress", "--pure", *params, stdout=StringIO(),
        )  # fmt: skip
        return json.loads(out.read_text())

    wide_band = CONFIG.replace(
        "default_output_tokens: 300",
        "default_output_tokens: 300\n    routing: {band: 3.0, beta: 1.0}",
    )
    for directory in ("default", "given", "own"):
        (tmp_path / directory).mkdir()
    default = run("default", CONFIG)
    given = run("given", CONFIG, "--param", "band=3", "--param", "beta=1")
    own = run("own", wide_band)

    assert given == own
    assert given["overall"] != default["overall"]
    with pytest.raises(CommandError, match=r"known: .*band"):
        run("default", CONFIG, "--param", "bandwidth=3")
    with pytest.raises(CommandError, match="NAME=NUMBER"):
        run("default", CONFIG, "--param", "band")


def test_it_names_the_market_file_in_errors_and_says_which_providers_it_left_out(tmp_path: Path):
    config, market = files(tmp_path, market=MARKET.replace("  - name: mid", "  - name: midx"))
    err = StringIO()
    call_command(
        "switchback", "--config", config, "--market", market, "--days", "0.5",
        "--json", str(tmp_path / "r.json"), "--no-progress", "--pure", stdout=StringIO(), stderr=err,
    )  # fmt: skip
    assert "provider mid is in the configuration but not in the market file" in err.getvalue()
    broken = tmp_path / "broken.yaml"
    broken.write_text("providers: [\n  - name: x\n")
    with pytest.raises(CommandError, match=f"{broken}: .*not valid YAML"):
        call_command("switchback", "--config", config, "--market", str(broken), "--pure")
