"""The experiment's human side: a short markdown report and PNG plots (matplotlib, Agg).

``plots_write`` draws the served-traffic shares of every endpoint over time (one panel per
model, the blocks of each router shaded) and each metric per block (new and old side by side,
the two blocks of a pair joined). ``report_markdown`` writes the tables the JSON holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from simulator.switchback.analysis import arm_values
from simulator.switchback.design import DAY
from simulator.switchback.experiment import SHARE_BIN_S, Run

# The production experiment the design comes from (SPEC G16): the bar to clear.
TARGETS: dict[str, tuple[str, Callable[[float], bool]]] = {
    "ttft_change": ("≤ −16.9 %", lambda v: v <= -0.169),
    "throughput_change": ("≥ +16.3 %", lambda v: v >= 0.163),
    "rate_limit_change": ("≤ −67 %", lambda v: v <= -0.67),
    "cost_change": ("≤ +6.0 %", lambda v: v <= 0.06),
}
ROWS = [
    ("ttft_change", "ttft_p50", "TTFT p50 (s)"),
    ("ttft_mean_change", "ttft_mean", "TTFT mean (s)"),
    ("wait_mean_change", "wait_mean", "… of it before the answer's attempt was sent (s)"),
    ("throughput_change", "throughput", "throughput e2e (tok/s)"),
    ("rate_limit_change", "rate_limit", "provider 429s per request"),
    ("broker_refusal_change", "broker_refusal", "broker refusals per request (not 429s)"),
    ("error_change", "error", "error rate"),
    ("capacity_failure_change", "capacity_failure", "refused for capacity"),
    ("cost_change", "cost", "cost per request (USD)"),
    (
        "cost_per_good_change",
        "cost_per_good",
        "cost per good answer (USD; not a malformed tool call)",
    ),
    ("served_change", "served", "served share"),
    ("over_reserved_change", "over_reserved", "output tokens over-reserved per answer"),
]
BLOCK_METRICS = [
    ("ttft_p50", "TTFT p50 (s)"),
    ("throughput", "throughput (tok/s)"),
    ("rate_limit", "provider 429s per request"),
    ("cost", "cost per request (USD)"),
    ("error", "error rate"),
    ("served", "served share"),
]
COLOURS = {"new": "#1b7f3b", "old": "#7a7a7a"}


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f} %"


def figure_text(value: float | None) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.3f}"
    return f"{value:.4g}"


def _table(estimate: Mapping[str, Any], with_targets: bool) -> list[str]:
    head = "| metric | new | old | change | 95 % CI |"
    rule = "|---|---:|---:|---:|---|"
    if with_targets:
        head += " target | met |"
        rule += "---|---|"
    lines = [head, rule]
    for change, metric, label in ROWS:
        ci = estimate["ci"].get(change)
        ci_text = "n/a" if ci is None else f"[{ci[0] * 100:+.1f} %, {ci[1] * 100:+.1f} %]"
        row = (
            f"| {label} | {figure_text(estimate['new'].get(metric))}"
            f" | {figure_text(estimate['old'].get(metric))}"
            f" | {_pct(estimate.get(change))} | {ci_text} |"
        )
        if with_targets:
            target = TARGETS.get(change)
            value = estimate.get(change)
            if target is None:
                row += " | |"
            else:
                met = "n/a" if value is None else ("yes" if target[1](value) else "**no**")
                row += f" {target[0]} | {met} |"
        lines.append(row)
    return lines


# Below this share of requests served in both arms, capacity rather than ranking decides.
CAPACITY_BOUND_BELOW = 0.9


def capacity_warning(result: Mapping[str, Any]) -> str | None:
    """A warning when both arms served few requests: the market is short of capacity.

    Under saturation the broker admits a request wherever there is room, whichever endpoint
    the router ranked first, so the arms can hardly differ; the warning says so before anyone
    reads the changes as the router's doing.
    """
    overall = result["overall"]
    served = (overall["new"].get("served"), overall["old"].get("served"))
    if any(s is None for s in served) or max(served) >= CAPACITY_BOUND_BELOW:
        return None
    return (
        f"capacity-bound: the new arm served {served[0]:.0%} of requests, the old "
        f"{served[1]:.0%}. Where capacity decides who is served, the routers can hardly "
        "differ: lower the market's traffic rates (--scale shrinks traffic and capacity "
        "together) or give its providers the capacity they are meant to have."
    )


def report_markdown(run: Run, *, command: str, plots: Sequence[str] = (), notes: str = "") -> str:
    """The report: command, design, overall and per-model tables, plots, wall time."""
    result = run.result
    exp = result["experiment"]
    lines = [
        f"# Switchback experiment: {report_title(exp)} (SPEC G16)",
        "",
        "```",
        command,
        "```",
        "",
        f"- Arms: new = `{exp['arms']['new']}`, old = `{exp['arms']['old']}`; seed {exp['seed']}."
        + _reservations(exp),
        f"- {exp['days']:g} simulated days at scale {exp['scale']:g}, blocks of "
        f"{exp['block_s'] / 3600:g} h (first {exp['warmup_s'] / 3600:g} h discarded), "
        f"{exp['pairs']} pairs; {exp['requests']:,} logical requests simulated.",
        f"- Wall time {run.wall_s:.0f} s ({len(run.segments)} segment(s): "
        + ", ".join(f"{w:.0f} s" for w in run.segment_wall_s)
        + ").",
        "",
    ]
    warning = capacity_warning(result)
    if warning is not None:
        lines += [f"**Warning — {warning}**", ""]
    lines += [
        "## Overall",
        "",
        *_table(result["overall"], with_targets=True),
        "",
    ]
    for model, estimate in result["per_model"].items():
        lines += [f"## {model}", "", *_table(estimate, with_targets=False), ""]
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{Path(p).stem}]({p})" for p in plots]
        lines.append("")
    if notes:
        lines += [notes, ""]
    return "\n".join(lines)


def report_title(exp: Mapping[str, Any]) -> str:
    """What the two arms compare: the routers, or how streams reserve on one router."""
    arms, modes = exp["arms"], exp.get("stream_reservation")
    if arms["new"] == arms["old"] and modes and modes["new"] != modes["old"]:
        return f"streams reserving `{modes['new']}` vs `{modes['old']}` (C10), one router"
    if arms["new"] == arms["old"]:
        return f"`{arms['new']}` against itself (A/A)"
    return f"`{arms['new']}` router vs `{arms['old']}`"


def _reservations(exp: Mapping[str, Any]) -> str:
    modes = exp.get("stream_reservation")
    if not modes:
        return ""
    return f" Streams reserve: new `{modes['new']}`, old `{modes['old']}` (C10)."


def plots_write(run: Run, directory: Path, *, prefix: str = "") -> list[Path]:
    """Traffic shares over time and each metric per block, as PNG files in ``directory``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = [
        _shares_plot(run, plt, directory / f"{prefix}shares.png"),
        _blocks_plot(run, plt, directory / f"{prefix}blocks.png"),
    ]
    plt.close("all")
    return written


def arm_side(run: Run, block: int) -> str:
    """``new`` or ``old``: the arm a block ran, by its place in its pair (the strategy's name
    cannot say it in an A/A run, or when the arms differ in stream reservation only)."""
    return "new" if run.design.arm_of(block, run.design.orders()) == 0 else "old"


def _arm_strip(ax: Any, run: Run, low: float, high: float) -> None:
    """A band from ``low`` to ``high`` coloured by the router of each block (warm-up paler)."""
    design = run.design
    for block in range(2 * design.pairs):
        arm = arm_side(run, block)
        start = block * design.block_s / 3600
        warm = start + design.warmup_s / 3600
        end = (block + 1) * design.block_s / 3600
        ax.fill_between([start, warm], low, high, color=COLOURS[arm], alpha=0.3, lw=0)
        ax.fill_between([warm, end], low, high, color=COLOURS[arm], alpha=0.9, lw=0)


def _shares_plot(run: Run, plt: Any, path: Path) -> Path:
    models = sorted({e.split("@")[0] for _, e in run.shares})
    fig, axes = plt.subplots(len(models), 1, figsize=(14, 3.2 * len(models)), squeeze=False)
    bins = 1 + max((b for b, _ in run.shares), default=0)
    hours = [b * SHARE_BIN_S / 3600 for b in range(bins)]
    for ax, model in zip(axes[:, 0], models, strict=True):
        endpoints = sorted({e for _, e in run.shares if e.startswith(model + "@")})
        counts = {e: [run.shares.get((b, e), 0) for b in range(bins)] for e in endpoints}
        totals = [sum(counts[e][b] for e in endpoints) or 1 for b in range(bins)]
        stacks = [[c / t for c, t in zip(counts[e], totals, strict=True)] for e in endpoints]
        ax.stackplot(hours, stacks, labels=[e.split("@")[1] for e in endpoints], alpha=0.85)
        _arm_strip(ax, run, 1.02, 1.09)
        ax.set_xlim(0, run.design.duration_s / 3600)
        ax.set_ylim(0, 1.1)
        ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
        ax.set_ylabel("share of answers")
        ax.set_title(
            f"{model}: who served the answers (top strip: green = new router, grey = old; "
            "pale = warm-up)"
        )
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("hours since the start (local midnight)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path


def _blocks_plot(run: Run, plt: Any, path: Path) -> Path:
    fig, axes = plt.subplots(len(BLOCK_METRICS), 1, figsize=(14, 2.4 * len(BLOCK_METRICS)))
    design = run.design
    for ax, (metric, label) in zip(axes, BLOCK_METRICS, strict=True):
        xs: dict[str, list[float]] = {"new": [], "old": []}
        ys: dict[str, list[float]] = {"new": [], "old": []}
        for block in sorted(run.blocks):
            value = arm_values([run.blocks[block]["*"]]).get(metric)
            if value is None:
                continue
            arm = arm_side(run, block)
            xs[arm].append((block + 0.5) * design.block_s / 3600)
            ys[arm].append(value)
        by_block = {b: arm_values([run.blocks[b]["*"]]).get(metric) for b in sorted(run.blocks)}
        for pair in range(design.pairs):
            a, b = by_block.get(2 * pair), by_block.get(2 * pair + 1)
            if a is not None and b is not None:
                x = [
                    (2 * pair + 0.5) * design.block_s / 3600,
                    (2 * pair + 1.5) * design.block_s / 3600,
                ]
                ax.plot(x, [a, b], "-", color="#bbbbbb", lw=0.8)
        for arm in ("new", "old"):
            ax.plot(xs[arm], ys[arm], "o", color=COLOURS[arm], label=arm, ms=4)
        ax.set_ylabel(label, fontsize=8)
        ax.set_xlim(0, design.duration_s / 3600)
        for day in range(1, int(design.duration_s // DAY) + 1):
            ax.axvline(day * 24, color="#cccccc", lw=0.8)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[0].set_title(
        "each metric per block (all models; measured part of each block; lines join a pair)"
    )
    axes[-1].set_xlabel("hours since the start (local midnight)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path
