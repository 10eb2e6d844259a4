"""Server-rendered SVG charts for the ops pages (SPEC H3): series in, one ``<svg>`` string out.

No JavaScript, no external assets: the pages must work on a machine without internet. Pure
Python (no Django, no clock). Every text that reaches the markup — titles, labels, series names,
units — is escaped here, so a caller may mark the result safe.

Values are clamped at zero: the ops charts show counts, tokens, money and durations. ``None``
is "no data" — a gap in a line, nothing in a bar.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

# Colours that read on the admin's light and dark themes.
PALETTE = ("#3f7fbf", "#d9822b", "#c23934", "#7b61a8", "#4d9e5b", "#8a8a8a", "#b5a13a")
_COLOUR = re.compile(r"^#[0-9a-fA-F]{3}(?:[0-9a-fA-F]{3})?$")

MARGIN_LEFT = 64  # room for the y-axis labels
MARGIN_RIGHT = 12
MARGIN_TOP = 28  # the title
MARGIN_BOTTOM = 22  # the x-axis labels
LEGEND_ROW = 18
MAX_X_LABELS = 8


@dataclass(frozen=True)
class Series:
    """One named row of values, one per x label; ``colour`` a hex colour or None (palette)."""

    name: str
    values: Sequence[float | None]
    colour: str | None = None


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^k that is ≥ ``value`` (1 for nothing to show)."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        candidate = step * 10.0**exponent
        if candidate >= value * (1 - 1e-12):
            return candidate
    return 10.0 ** (exponent + 1)  # pragma: no cover - the loop always returns


def format_value(value: float, unit: str = "") -> str:
    """A short human number: 950, 1.2k, 3.4M, 0.012 (and the unit after a space)."""
    magnitude = abs(value)
    if magnitude >= 1e9:
        text = f"{value / 1e9:.3g}G"
    elif magnitude >= 1e6:
        text = f"{value / 1e6:.3g}M"
    elif magnitude >= 1e4:
        text = f"{value / 1e3:.3g}k"
    elif magnitude >= 100 or value == int(value):
        text = f"{value:.0f}"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}" if unit else text


def _colours(series: Sequence[Series]) -> list[str]:
    out = []
    for i, s in enumerate(series):
        colour = s.colour or PALETTE[i % len(PALETTE)]
        if not _COLOUR.match(colour):
            raise ValueError(f"not a hex colour: {colour!r}")
        out.append(colour)
    return out


def _clean(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return max(0.0, float(value))


@dataclass(frozen=True)
class _Frame:
    """The plot area of one chart and its y scale."""

    width: int
    height: int
    count: int  # number of x slots
    y_max: float

    @property
    def left(self) -> float:
        return MARGIN_LEFT

    @property
    def top(self) -> float:
        return MARGIN_TOP

    @property
    def plot_width(self) -> float:
        return self.width - MARGIN_LEFT - MARGIN_RIGHT

    @property
    def plot_height(self) -> float:
        return self.height - MARGIN_TOP - MARGIN_BOTTOM

    @property
    def bottom(self) -> float:
        return self.top + self.plot_height

    def slot(self) -> float:
        return self.plot_width / max(1, self.count)

    def x_centre(self, i: int) -> float:
        return self.left + self.slot() * (i + 0.5)

    def y(self, value: float) -> float:
        return self.bottom - self.plot_height * min(value, self.y_max) / self.y_max


def _n(x: float) -> str:
    return f"{x:.1f}"


def _open(frame: _Frame, title: str) -> list[str]:
    total_height = frame.height + LEGEND_ROW
    label = escape(title)
    return [
        f'<svg class="ops-chart" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'viewBox="0 0 {frame.width} {total_height}" width="{frame.width}" '
        f'height="{total_height}" aria-label="{label}">',
        f"<title>{label}</title>",
        f'<text class="ops-chart-title" x="{frame.left}" y="16">{label}</text>',
    ]


def _y_steps(y_max: float) -> int:
    # 4 steps of a 1 or 2 scale and 5 of a 2.5 or 5 scale: every gridline on a round number.
    mantissa = y_max / 10.0 ** math.floor(math.log10(y_max))
    return 5 if round(mantissa, 6) in (2.5, 5.0) else 4


def _axes(
    frame: _Frame, labels: Sequence[str], unit: str, ticks: Sequence[int] | None
) -> list[str]:
    parts = []
    steps = _y_steps(frame.y_max)
    for k in range(steps + 1):
        value = frame.y_max * k / steps
        y = _n(frame.y(value))
        parts.append(
            f'<line class="ops-chart-grid" x1="{frame.left}" y1="{y}" '
            f'x2="{_n(frame.left + frame.plot_width)}" y2="{y}"/>'
        )
        parts.append(
            f'<text class="ops-chart-axis" x="{frame.left - 6}" y="{y}" text-anchor="end" '
            f'dominant-baseline="middle">{escape(format_value(value, unit))}</text>'
        )
    if ticks is None:
        ticks = range(0, len(labels), max(1, math.ceil(len(labels) / MAX_X_LABELS)))
    for i in ticks:
        parts.append(
            f'<text class="ops-chart-axis" x="{_n(frame.x_centre(i))}" '
            f'y="{_n(frame.bottom + 15)}" text-anchor="middle">{escape(labels[i])}</text>'
        )
    return parts


def _legend(frame: _Frame, series: Sequence[Series], colours: list[str]) -> list[str]:
    parts = []
    x = frame.left
    y = frame.height + 6
    for s, colour in zip(series, colours, strict=True):
        parts.append(f'<rect x="{_n(x)}" y="{y}" width="10" height="10" fill="{colour}"/>')
        parts.append(
            f'<text class="ops-chart-legend" x="{_n(x + 14)}" y="{y + 9}">{escape(s.name)}</text>'
        )
        x += 24 + 6.5 * len(s.name)
    return parts


def _check(labels: Sequence[str], series: Sequence[Series]) -> None:
    for s in series:
        if len(s.values) != len(labels):
            raise ValueError(f"series {s.name!r} has {len(s.values)} values for {len(labels)}")


def bar_chart(
    *,
    title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    unit: str = "",
    ticks: Sequence[int] | None = None,
    width: int = 640,
    height: int = 180,
) -> str:
    """Stacked bars, one per label; each segment's tooltip names its series and value.

    ``ticks``: the indices whose label the x axis shows (default: about ``MAX_X_LABELS``).
    """
    _check(labels, series)
    colours = _colours(series)
    clean = [[_clean(v) for v in s.values] for s in series]
    totals = [sum(v for v in column if v is not None) for column in zip(*clean, strict=True)]
    frame = _Frame(width, height, len(labels), nice_ceiling(max(totals, default=0.0)))
    parts = _open(frame, title) + _axes(frame, labels, unit, ticks)
    bar = frame.slot() * 0.8
    for i, label in enumerate(labels):
        base = 0.0
        x = _n(frame.x_centre(i) - bar / 2)
        for s, colour, values in zip(series, colours, clean, strict=True):
            value = values[i]
            if not value:
                continue
            top, bottom = frame.y(base + value), frame.y(base)
            tip = escape(f"{label} · {s.name}: {format_value(value, unit)}")
            parts.append(
                f'<rect x="{x}" y="{_n(top)}" width="{_n(bar)}" height="{_n(bottom - top)}" '
                f'fill="{colour}"><title>{tip}</title></rect>'
            )
            base += value
    parts += _legend(frame, series, colours)
    parts.append("</svg>")
    return "".join(parts)


def line_chart(
    *,
    title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    unit: str = "",
    ticks: Sequence[int] | None = None,
    width: int = 640,
    height: int = 180,
) -> str:
    """One line per series, broken where a value is missing; each point has a tooltip.

    ``ticks`` as for ``bar_chart``.
    """
    _check(labels, series)
    colours = _colours(series)
    clean = [[_clean(v) for v in s.values] for s in series]
    peak = max((v for values in clean for v in values if v is not None), default=0.0)
    frame = _Frame(width, height, len(labels), nice_ceiling(peak))
    parts = _open(frame, title) + _axes(frame, labels, unit, ticks)
    for s, colour, values in zip(series, colours, clean, strict=True):
        path: list[str] = []
        pen_down = False
        for i, value in enumerate(values):
            if value is None:
                pen_down = False
                continue
            path.append(f"{'L' if pen_down else 'M'}{_n(frame.x_centre(i))} {_n(frame.y(value))}")
            pen_down = True
        if path:
            parts.append(
                f'<path d="{" ".join(path)}" fill="none" stroke="{colour}" stroke-width="1.8"/>'
            )
        for i, value in enumerate(values):
            if value is None:
                continue
            tip = escape(f"{labels[i]} · {s.name}: {format_value(value, unit)}")
            parts.append(
                f'<circle cx="{_n(frame.x_centre(i))}" cy="{_n(frame.y(value))}" r="2" '
                f'fill="{colour}"><title>{tip}</title></circle>'
            )
    parts += _legend(frame, series, colours)
    parts.append("</svg>")
    return "".join(parts)
