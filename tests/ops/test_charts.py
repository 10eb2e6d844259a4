"""The SVG chart helper of the ops pages: well-formed, escaped, scaled."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ops.charts import (
    MARGIN_BOTTOM,
    MARGIN_TOP,
    Series,
    bar_chart,
    format_value,
    line_chart,
    nice_ceiling,
)

SVG = "{http://www.w3.org/2000/svg}"
HEIGHT = 180
PLOT_HEIGHT = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
BOTTOM = MARGIN_TOP + PLOT_HEIGHT


def parse(markup: str) -> ET.Element:
    return ET.fromstring(markup)  # raises on markup that is not well-formed


def bars(root: ET.Element) -> list[ET.Element]:
    return [r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]


def test_it_escapes_every_text_it_writes() -> None:
    hostile = '<script>alert("x")</script> & more'
    markup = bar_chart(
        title=hostile, labels=[hostile, "b"], series=[Series(hostile, [1, 2])], unit="<u>"
    )

    assert "<script>" not in markup and "<u>" not in markup
    assert "&lt;script&gt;" in markup
    root = parse(markup)
    texts = [t.text or "" for t in root.iter(f"{SVG}text")] + [
        t.text or "" for t in root.iter(f"{SVG}title")
    ]
    assert any(hostile in text for text in texts)  # shown as text, not as markup
    assert root.get("aria-label") == hostile


def test_it_scales_bars_to_a_nice_maximum() -> None:
    markup = bar_chart(
        title="t", labels=["a", "b", "c"], series=[Series("s", [0, 45, 90])], height=HEIGHT
    )

    heights = [float(r.get("height", "0")) for r in bars(parse(markup))]
    # 90 rounds up to a scale of 100: the bars take 45 % and 90 % of the plot's height.
    assert heights == pytest.approx([0.45 * PLOT_HEIGHT, 0.9 * PLOT_HEIGHT], abs=0.11)
    assert ">100</text>" in markup and ">50</text>" in markup


@pytest.mark.parametrize(
    ("peak", "gridlines"),
    [(90, ["0", "25", "50", "75", "100"]), (4.5, ["0", "1", "2", "3", "4", "5"]),
     (2100, ["0", "500", "1000", "1500", "2000", "2500"])],
)  # fmt: skip
def test_its_gridlines_sit_on_round_numbers(peak: float, gridlines: list[str]) -> None:
    root = parse(line_chart(title="t", labels=["a", "b"], series=[Series("s", [0, peak])]))

    axis = [t.text for t in root.iter(f"{SVG}text") if t.get("text-anchor") == "end"]
    assert axis == gridlines


def test_it_stacks_series_on_each_other() -> None:
    markup = bar_chart(
        title="t",
        labels=["a"],
        series=[Series("served", [30], "#00aa00"), Series("refused", [20], "#aa0000")],
        height=HEIGHT,
    )

    served, refused = bars(parse(markup))
    assert float(served.get("y", "0")) + float(served.get("height", "0")) == pytest.approx(
        BOTTOM, abs=0.11
    )
    # The refused segment sits on top of the served one; the stack of 50 is the scale's top.
    assert float(refused.get("y", "0")) + float(refused.get("height", "0")) == pytest.approx(
        float(served.get("y", "0")), abs=0.11
    )
    assert float(served.get("height", "0")) == pytest.approx(0.6 * PLOT_HEIGHT, abs=0.11)
    assert float(refused.get("y", "0")) == pytest.approx(MARGIN_TOP, abs=0.11)
    assert refused.get("fill") == "#aa0000"
    assert served.findtext(f"{SVG}title") == "a · served: 30"


def test_a_line_breaks_where_values_are_missing() -> None:
    markup = line_chart(
        title="t", labels=list("abcde"), series=[Series("p95", [1, 2, None, 4, 5])], unit="ms"
    )

    root = parse(markup)
    [path] = root.iter(f"{SVG}path")
    assert path.get("d", "").count("M") == 2
    tips = [c.findtext(f"{SVG}title") for c in root.iter(f"{SVG}circle")]
    assert tips == ["a · p95: 1 ms", "b · p95: 2 ms", "d · p95: 4 ms", "e · p95: 5 ms"]


def test_it_draws_an_empty_chart_without_dividing_by_zero() -> None:
    root = parse(line_chart(title="t", labels=["a", "b"], series=[Series("s", [None, None])]))
    assert list(root.iter(f"{SVG}path")) == []
    root = parse(bar_chart(title="t", labels=[], series=[Series("s", [])]))
    assert bars(root) == []


def test_it_refuses_what_it_cannot_draw_safely() -> None:
    with pytest.raises(ValueError, match="hex colour"):
        bar_chart(title="t", labels=["a"], series=[Series("s", [1], 'red" onload="x')])
    with pytest.raises(ValueError, match="values"):
        line_chart(title="t", labels=["a", "b"], series=[Series("s", [1])])


def test_negative_and_infinite_values_do_not_escape_the_plot() -> None:
    markup = line_chart(
        title="t", labels=["a", "b", "c"], series=[Series("s", [-5, float("inf"), 3])]
    )

    ys = [float(c.get("cy", "0")) for c in parse(markup).iter(f"{SVG}circle")]
    assert all(MARGIN_TOP <= y <= BOTTOM for y in ys) and len(ys) == 2


@given(st.floats(min_value=1e-6, max_value=1e12))
def test_a_nice_ceiling_is_above_the_value_and_at_most_twice_it(value: float) -> None:
    ceiling = nice_ceiling(value)

    assert value <= ceiling * (1 + 1e-9) and ceiling <= 2 * value * (1 + 1e-9)


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [(0, "", "0"), (950, "", "950"), (12_500, "", "12.5k"), (3_400_000, "", "3.4M"),
     (0.0123, "USD", "0.0123 USD"), (2.5, "ms", "2.5 ms")],
)  # fmt: skip
def test_it_formats_values_short(value: float, unit: str, text: str) -> None:
    assert format_value(value, unit) == text
