"""The providersim command line: ports, ready file, errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.launcher import LaunchError, parse_port_overrides, planned_ports, write_ready_file
from simulator.model import parse_market_text

from .helpers import REFERENCE_MARKET

ROOT = Path(__file__).resolve().parents[2]


def test_it_reads_port_overrides():
    assert parse_port_overrides("alpha=0, beta=9202") == {"alpha": 0, "beta": 9202}
    assert parse_port_overrides("") == {}
    for bad in ("alpha", "alpha=x", "=5", "alpha=70000"):
        with pytest.raises(LaunchError):
            parse_port_overrides(bad)


def test_it_plans_ports_from_overrides_then_the_offset():
    market = parse_market_text(REFERENCE_MARKET.read_text())

    assert planned_ports(market, {"beta": 0}, 1000) == {"alpha": 10101, "beta": 0, "gamma": 10103}
    with pytest.raises(LaunchError, match="delta"):
        planned_ports(market, {"delta": 1}, 0)


def test_it_writes_the_ready_file_as_provider_to_port_json(tmp_path):
    path = tmp_path / "ready.json"

    write_ready_file(path, {"alpha": 40001, "beta": 40002})

    assert json.loads(path.read_text()) == {"alpha": 40001, "beta": 40002}
    assert [p.name for p in tmp_path.iterdir()] == ["ready.json"]


def test_it_exits_with_the_field_path_on_a_bad_market_file(tmp_path):
    market = tmp_path / "market.yaml"
    market.write_text(REFERENCE_MARKET.read_text().replace("protocol: anthropic", "protocol: smtp"))

    result = subprocess.run(
        [sys.executable, "manage.py", "providersim", "--market", str(market)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "providers[1].protocol" in result.stderr
