"""The side-by-side report's verdicts on the Redis phase (bench/anchors_report.py): the 0.5 s
case is compared with its paced twin pair by pair, and the pairs' median decides."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def redis_row(case: str, rep: int, gateway_ms: float, redis_us: float = 150.0) -> dict:
    slow = case.startswith("ttft500")
    return {
        "case": case,
        "rep": rep,
        "upstream_ttft_ms": 500 if slow else 0,
        "think_s": 0.5 if case == "ttft0_paced" else 0.0,
        "stream": False,
        "requests": 960,
        "connections": 16,
        "errors": 0,
        "seconds": 30.0,
        "redis_usec_per_req": 40.0,
        "redis_cpu_us_per_req": redis_us,
        "redis_idle_cpu_ms_per_s": 1.9,
        "lone_append_cpu_us": 143.0,
        "redis_cpu_above_idle_us_per_req": redis_us - 60,
        "commands_per_req": 7.0,
        "evalsha_per_req": 0.15,
        "usec_per_evalsha": 250.0,
        "bytes_in_per_req": 1000.0,
        "bytes_out_per_req": 200.0,
        "gateway_cpu_ms_per_req": gateway_ms,
        "worker_cpu_shares": [0.1, 0.9],
        "breakdown": {"fcall": [0.15, 40.0]},
    }


def render(tmp_path: Path, redis: list[dict], floor: tuple[float, float] | None = None) -> str:
    fields = ["label", "rep", "case", "rps", "p50_ms", "gw_cpu_ms_per_req", "aux_cpu_ms_per_req"]
    with (tmp_path / "results.csv").open("w", newline="") as f:
        out = csv.DictWriter(f, fields)
        out.writeheader()
        for label in ("direct", "switchyard-2w", "litellm-2w"):
            for case in ("c1", "c16", "c64", "c64_stream"):
                out.writerow({"label": label, "rep": 1, "case": case, "rps": 100, "p50_ms": 1})
    with (tmp_path / "memory.csv").open("w", newline="") as f:
        out = csv.DictWriter(f, ["label", "sum_peak_rss_mib", "max_process_peak_rss_mib"])
        out.writeheader()
        out.writerow(
            {"label": "switchyard-2w", "sum_peak_rss_mib": 250, "max_process_peak_rss_mib": 110}
        )
    (tmp_path / "redis.json").write_text(json.dumps(redis))
    if floor:
        rows = [
            {"case": case, "requests": 960, "errors": 0, "seconds": 30.0, "cpu_ms_per_req": ms}
            for case, ms in zip(("ttft0", "ttft0_paced"), floor, strict=True)
        ]
        (tmp_path / "floor.json").write_text(json.dumps(rows))
    report = ROOT / "bench" / "anchors_report.py"
    return subprocess.check_output([sys.executable, str(report), str(tmp_path)], text=True)


def acceptance(markdown: str, starting: str) -> str:
    [found] = [line for line in markdown.splitlines() if starting in line]
    return found


def phase(pairs: list[tuple[float, float]], slow_redis_us: tuple[float, ...] = ()) -> list[dict]:
    """The Redis phase's rows as bench/anchors_redis.py writes them: the fast case, then each
    pair in alternating order, then the 64-connection case."""
    rows = [redis_row("ttft0", 1, 1.0, 50.0)]
    for rep, (paced, slow) in enumerate(pairs, start=1):
        us = slow_redis_us[rep - 1] if slow_redis_us else 150.0
        twins = [redis_row("ttft0_paced", rep, paced), redis_row("ttft500", rep, slow, us)]
        rows += twins if rep % 2 else twins[::-1]
    return [*rows, redis_row("ttft500_c64", 1, 2.0, 110.0)]


def test_the_gateway_cpu_line_is_decided_by_the_median_of_the_pairs(tmp_path: Path) -> None:
    """One pair at +30 % (a burst of arrivals, a stray second of CPU) does not decide."""
    markdown = render(tmp_path, phase([(1.0, 1.3), (2.0, 2.1), (1.0, 1.08)]))
    line = acceptance(markdown, "gateway CPU per request at 0.5 s")
    assert line.startswith("- **met**")
    assert "1.00 → 1.30 ms (+30 %" in line
    assert "2.00 → 2.10 ms (+5 %" in line
    assert "median **+8 %**" in line


def test_two_pairs_over_20_percent_fail_the_gateway_cpu_line(tmp_path: Path) -> None:
    markdown = render(tmp_path, phase([(1.0, 1.3), (2.0, 2.1), (1.0, 1.25)]))
    line = acceptance(markdown, "gateway CPU per request at 0.5 s")
    assert line.startswith("- **not met**")
    assert "median **+25 %**" in line


def test_the_redis_line_takes_the_median_pair_and_names_the_floor(tmp_path: Path) -> None:
    markdown = render(tmp_path, phase([(1.0, 1.0)] * 3, slow_redis_us=(200.0, 110.0, 115.0)))
    line = acceptance(markdown, "Redis CPU per proxied request")
    assert line.startswith("- **met**")
    assert "50 / 115 µs (pairs: 200, 110, 115)" in line
    assert "at 64 connections" in line
    assert "a lone ledger append alone costs 143 µs" in line


def test_the_gateway_cpu_line_names_the_python_floors_rise_between_the_same_loads(
    tmp_path: Path,
) -> None:
    markdown = render(tmp_path, phase([(3.5, 3.6)] * 3), floor=(0.2, 0.8))
    line = acceptance(markdown, "gateway CPU per request at 0.5 s")
    assert "closed loop at 16 connections 1.00 → 3.60 ms (+260 %)" in line
    assert "the Python floor between the same two loads: 0.200 → 0.800 ms, 4.0×" in line
