"""Streams in steps vs reserve-max on the saturated market (issue 18 item 5): the tables of
bench/results/stream_steps.md, from the JSON results of ``manage.py switchback`` runs.

Run the experiments first (each arm runs the routing-cost router; the arms differ only in how
streams reserve their output, ``--stream-reservation NEW,OLD``), e.g.:

    python manage.py switchback --config config/switchyard.yaml \
        --market config/market-saturated.yaml --arms routing_cost,routing_cost \
        --stream-reservation increments,max --days 2 --scale 0.25 --json ab-2d.json

then: .venv/bin/python bench/stream_steps.py ab-2d.json [aa-max-2d.json ...]

For each run: the changes new/old − 1 with their bootstrap CIs over block pairs; then, per arm
and provider, from the run's tallies — what its measured requests were served, the output its
leases held beyond what the answers had made (time-averaged, beside the bucket that holds it),
and what refused them (the broker's fast tries by bucket, the steps by bucket, the provider's
429s by limit).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchyard.settings")

from simulator.switchback.report import figure_text  # noqa: E402

ROWS = [
    ("served_change", "served", "served share", 1),
    ("ttft_change", "ttft_p50", "TTFT p50 of the served (s)", 1),
    ("rate_limit_change", "rate_limit", "provider 429s per request", 1),
    ("broker_refusal_change", "broker_refusal", "broker refusals per request", 1),
    ("capacity_failure_change", "capacity_failure", "refused for capacity", 1),
    ("error_change", "error", "error rate", 1),
    ("cost_change", "cost", "cost per served request (USD)", 1),
    ("over_reserved_change", "over_reserved", "output over-reserved per answer (tokens)", 1),
]
EXTRA = [
    ("unreserved", "output made beyond the lease per answer (tokens)"),
    ("steps_granted", "steps granted per answer"),
    ("steps_refused", "steps refused per answer"),
]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f} %"


def changes_table(result: dict[str, Any]) -> list[str]:
    overall = result["overall"]
    modes = result["experiment"].get("stream_reservation") or {"new": "?", "old": "?"}
    lines = [
        f"| metric | new: {modes['new']} | old: {modes['old']} | change | 95 % CI |",
        "|---|---:|---:|---:|---|",
    ]
    for change, metric, label, _ in ROWS:
        ci = overall["ci"].get(change)
        ci_text = "n/a" if ci is None else f"[{ci[0] * 100:+.1f} %, {ci[1] * 100:+.1f} %]"
        lines.append(
            f"| {label} | {figure_text(overall['new'].get(metric))}"
            f" | {figure_text(overall['old'].get(metric))}"
            f" | {_pct(overall.get(change))} | {ci_text} |"
        )
    for metric, label in EXTRA:
        lines.append(
            f"| {label} | {figure_text(overall['new'].get(metric))}"
            f" | {figure_text(overall['old'].get(metric))}"
            " | | |"
        )
    return lines


def _limits(config_path: str, scale: float) -> dict[str, dict[str, float]]:
    """Each provider's output-token and spend bucket capacities at ``scale`` (per period)."""
    from configfile import config_parse, config_read

    config = config_parse(config_read(config_path))
    out: dict[str, dict[str, float]] = {}
    for provider in config.providers:
        for limit in provider.limits:
            if limit.dimension in ("output_tokens", "spend") and limit.capacity is not None:
                out.setdefault(provider.name, {})[limit.dimension] = limit.capacity * scale
    return out


def _prices(config_path: str) -> dict[str, float]:
    """USD per million output tokens of each endpoint (``slug@provider``)."""
    from configfile import config_parse, config_read

    config = config_parse(config_read(config_path))
    return {
        f"{m.slug}@{e.provider}": float(e.price.output) for m in config.models for e in m.endpoints
    }


def providers_table(result: dict[str, Any], config_path: str) -> list[str]:
    exp = result["experiment"]
    measured_s = exp["pairs"] * (exp["block_s"] - exp["warmup_s"])  # per arm
    limits, prices = _limits(config_path, exp["scale"]), _prices(config_path)
    lines = [
        "| arm | provider | answers/min | output tokens/min (of the bucket's refill) | "
        "output held beyond made (mean tokens, of the bucket) | spend held beyond made (USD) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    modes = exp.get("stream_reservation") or {"new": "new", "old": "old"}
    for arm in ("new", "old"):
        tallies = result["tallies"][arm]
        for provider in sorted({k.rsplit("@", 1)[1] for k in tallies if "@" in k}):
            mine = {k: v for k, v in tallies.items() if k.endswith("@" + provider)}
            answers = sum(v for k, v in mine.items() if k.startswith("answers:"))
            output = sum(v for k, v in mine.items() if k.startswith("output:"))
            held_ts = {k.split(":", 1)[1]: v for k, v in mine.items() if k.startswith("held:")}
            held = sum(held_ts.values()) / measured_s
            spend = sum(v * prices.get(e, 0.0) / 1e6 for e, v in held_ts.items()) / measured_s
            bucket = limits.get(provider, {})
            per_min = output / measured_s * 60
            share, rate = "", ""
            if "output_tokens" in bucket:
                share = f" ({held / bucket['output_tokens']:.1%} of {bucket['output_tokens']:,.0f})"
                rate = f" ({per_min / bucket['output_tokens']:.0%})"
            spend_text = (
                f"{spend:.3f} of {bucket['spend']:g} / 5 h" if "spend" in bucket else f"{spend:.3f}"
            )
            lines.append(
                f"| {modes[arm]} | {provider} | {answers / measured_s * 60:,.1f} | "
                f"{per_min:,.0f}{rate} | {held:,.0f}{share} | {spend_text} |"
            )
    return lines


def refusals_table(result: dict[str, Any]) -> list[str]:
    exp = result["experiment"]
    modes = exp.get("stream_reservation") or {"new": "new", "old": "old"}
    requests = {arm: result["overall"][arm]["requests"] for arm in ("new", "old")}
    labels = sorted(
        {
            k
            for arm in ("new", "old")
            for k in result["tallies"][arm]
            if k.split(":", 1)[0] in ("broker", "step", "provider")
        },
        key=lambda k: -(result["tallies"]["old"].get(k, 0) + result["tallies"]["new"].get(k, 0)),
    )
    lines = [
        f"| what refused | {modes['new']} (per 1,000 requests) | {modes['old']} |",
        "|---|---:|---:|",
    ]
    for label in labels:
        per = [
            1000 * result["tallies"][arm].get(label, 0) / requests[arm] for arm in ("new", "old")
        ]
        lines.append(f"| `{label}` | {per[0]:.1f} | {per[1]:.1f} |")
    return lines


def main(paths: list[str], config_path: str = "config/switchyard.yaml") -> None:
    import django

    django.setup()
    for path in paths:
        result = json.loads(Path(path).read_text())
        exp = result["experiment"]
        print(
            f"## {Path(path).stem}: {exp['days']:g} days at scale {exp['scale']:g}, "
            f"{exp['pairs']} pairs, {exp['requests']:,} requests\n"
        )
        print("\n".join(changes_table(result)) + "\n")
        print("\n".join(providers_table(result, config_path)) + "\n")
        print("\n".join(refusals_table(result)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
