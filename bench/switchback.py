"""The G16 switchback experiment on the reference market: the acceptance run and its checks.

Run: .venv/bin/python bench/switchback.py [--scale 1] [--aa-scale 1] [--skip-saturated] [--pure]
Writes bench/results/switchback.md, and plots and result JSON under bench/results/switchback/.

Three runs, each the same as a ``manage.py switchback`` command (printed in the report), on the
cores compiled by mypyc unless ``--pure`` (the same results; the wall time is the speed target):
1. the reference week (config/switchyard.yaml + config/market.yaml), new vs old router — at
   scale 1 this is the acceptance run;
2. the A/A check: the new router in both arms, every CI must contain 0;
3. the saturated week (config/market-saturated.yaml: the same providers, 3.3 × the traffic),
   where capacity, not ranking, decides who is served: the broker's stress case.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchyard.settings")

from common import compiled_cores as compiled  # noqa: E402  (imports neither core)

if TYPE_CHECKING:
    from simulator.switchback.experiment import Options, Run

RESULTS = ROOT / "bench" / "results"
OUT = RESULTS / "switchback"
CONFIG = "config/switchyard.yaml"
MARKET = "config/market.yaml"
SATURATED = "config/market-saturated.yaml"


def command(config: str, market: str, scale: float, extra: str = "") -> str:
    return (
        f"python manage.py switchback --config {config} --market {market} --scale {scale:g}" + extra
    )


def run(label: str, options: Options) -> Run:
    from simulator.switchback.experiment import experiment_run

    print(f"{label}: running ({options.market_path}, scale {options.scale:g}) …", flush=True)
    started = time.perf_counter()
    result = experiment_run(options)
    print(f"{label}: {time.perf_counter() - started:.0f} s, {result.requests:,} requests")
    return result


def demand_lines(path: str) -> list[str]:
    """A market's demand (routes' requests and input tokens per minute), from its file."""
    from simulator.model import parse_market_text

    market = parse_market_text((ROOT / path).read_text())
    assert market.traffic is not None
    lines = [
        "| route | requests/min (mean, peak) | input tokens/request (mean) "
        "| input tokens/min (mean) |",
        "|---|---:|---:|---:|",
    ]
    for name, route in market.traffic.models.items():
        dist = route.input_tokens.distribution()
        mean_in = math.exp(dist.mu + dist.sigma**2 / 2)
        rpm = route.requests_per_minute
        peak = rpm.mean * (1 + rpm.diurnal_amplitude)
        lines.append(
            f"| {name} | {rpm.mean:g}, {peak:g} | {mean_in:,.0f} | {rpm.mean * mean_in:,.0f} |"
        )
    return lines


def checks(result: dict) -> list[str]:
    """The A/A table: every change's CI, and whether it contains 0."""
    lines = ["| scope | change | point | 95 % CI | contains 0 |", "|---|---|---:|---|---|"]
    scopes = {"overall": result["overall"], **result["per_model"]}
    for scope, estimate in scopes.items():
        for name in ("ttft_change", "throughput_change", "rate_limit_change", "cost_change",
                     "error_change"):  # fmt: skip
            ci = estimate["ci"][name]
            value = estimate[name]
            inside = "n/a" if ci is None else ("yes" if ci[0] <= 0 <= ci[1] else "**no**")
            ci_text = "n/a" if ci is None else f"[{ci[0] * 100:+.1f} %, {ci[1] * 100:+.1f} %]"
            point = "n/a" if value is None else f"{value * 100:+.1f} %"
            lines.append(f"| {scope} | {name} | {point} | {ci_text} | {inside} |")
    return lines


def main() -> None:
    # Django and the cores load here, not at import: the compiled runs' spawned workers import
    # this script again, and must install the compiled cores before anything imports them.
    import django

    django.setup()
    from simulator.switchback.experiment import Options
    from simulator.switchback.report import plots_write

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--aa-scale", type=float, default=1.0)
    parser.add_argument("--skip-aa", action="store_true")
    parser.add_argument("--skip-saturated", action="store_true")
    parser.add_argument("--pure", action="store_true", help="run the cores as Python")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    build, args.cores = compiled.cores(pure=args.pure)

    reference = run("reference", Options(CONFIG, MARKET, scale=args.scale, compiled=build))
    (OUT / "reference.json").write_text(json.dumps(reference.result, indent=2, sort_keys=True))
    plots = plots_write(reference, OUT, prefix="reference-")

    aa = None
    if not args.skip_aa:
        aa = run("A/A", Options(CONFIG, MARKET, scale=args.aa_scale,
                                arms=("routing_cost", "routing_cost"), compiled=build))  # fmt: skip
        (OUT / "aa.json").write_text(json.dumps(aa.result, indent=2, sort_keys=True))

    saturated = None
    if not args.skip_saturated:
        saturated = run("saturated", Options(CONFIG, SATURATED, scale=1.0, compiled=build))
        (OUT / "saturated.json").write_text(json.dumps(saturated.result, indent=2, sort_keys=True))
        plots += plots_write(saturated, OUT, prefix="saturated-")

    write_report(args, reference, aa, saturated, plots)


def write_report(args, reference: Run, aa: Run | None, saturated: Run | None, plots):
    from simulator.switchback.report import _table

    exp = reference.result["experiment"]
    out = [
        "# Switchback experiment on the reference market (SPEC G16)",
        "",
        f"`bench/switchback.py --scale {args.scale:g} --aa-scale {args.aa_scale:g}` "
        f"on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; {args.cores}; "
        f"{time.strftime('%Y-%m-%d %H:%M')}.",
        "",
        "## 1. Reference week: routing cost (new) vs price only (old)",
        "",
        "```",
        command(
            CONFIG,
            MARKET,
            args.scale,
            " --json bench/results/switchback/reference.json --plots bench/results/switchback",
        ),
        "```",
        "",
        f"{exp['days']:g} simulated days, blocks of {exp['block_s'] / 3600:g} h with the first "
        f"{exp['warmup_s'] / 3600:g} h discarded, {exp['pairs']} pairs in a seeded, balanced "
        "random order "
        f"(seed {exp['seed']}), {exp['requests']:,} logical requests at scale {exp['scale']:g}. "
        f"**Wall time {reference.wall_s:.0f} s** ({len(reference.segments)} segments on "
        f"{min(len(reference.segments), os.cpu_count() or 1)} processes: "
        + ", ".join(f"{w:.0f} s" for w in reference.segment_wall_s)
        + ").",
        "",
        *_table(reference.result["overall"], with_targets=True),
        "",
    ]
    for model, estimate in reference.result["per_model"].items():
        out += [f"### {model}", "", *_table(estimate, with_targets=False), ""]
    out += [
        f"![{Path(p).stem}]({Path(p).relative_to(RESULTS)})"
        for p in plots
        if "reference-" in str(p)
    ]
    out.append("")
    if aa is not None:
        out += [
            "## 2. A/A check: the new router in both arms",
            "",
            "```",
            command(CONFIG, MARKET, args.aa_scale, " --arms routing_cost,routing_cost"),
            "```",
            "",
            f"Wall time {aa.wall_s:.0f} s, {aa.requests:,} requests.",
            "",
            *checks(aa.result),
            "",
        ]
    if saturated is not None:
        out += [
            "## 3. Saturated week: the same providers, 3.3 × the traffic",
            "",
            "```",
            command(CONFIG, SATURATED, 1.0),
            "```",
            "",
            f"Wall time {saturated.wall_s:.0f} s, {saturated.requests:,} requests.",
            "",
            *_table(saturated.result["overall"], with_targets=False),
            "",
        ]
        for model, estimate in saturated.result["per_model"].items():
            out += [f"### {model}", "", *_table(estimate, with_targets=False), ""]
        out += [
            f"![{Path(p).stem}]({Path(p).relative_to(RESULTS)})"
            for p in plots
            if "saturated-" in str(p)
        ]
        out.append("")
    out += ["## Demand of the reference market", "", *demand_lines(MARKET), ""]
    out += ["## Demand of the saturated market", "", *demand_lines(SATURATED), ""]
    # The written findings (bench/results/switchback-notes.md) come right after the heading.
    notes = RESULTS / "switchback-notes.md"
    if notes.exists():
        out[4:4] = [notes.read_text().rstrip("\n"), ""]
    (RESULTS / "switchback.md").write_text("\n".join(out) + "\n")
    print(f"wrote {RESULTS / 'switchback.md'}")


if __name__ == "__main__":
    main()
