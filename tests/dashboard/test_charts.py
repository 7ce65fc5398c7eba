"""The charts: well-formed SVG, every label escaped, nothing drawn from nothing, bars to scale."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from pgjobkit.dashboard import charts

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = "<script>alert(1)</script>\"'&é"
COLOURS = {"ok": "#2f9e44", "dead": "#d6336c"}


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # noqa: S314 (our own output, parsed to prove it well-formed)


def bars(root: ET.Element) -> list[ET.Element]:
    """The plot's bars: rects with a tooltip (the legend's swatches have none)."""
    return [r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]


def plot_bottom() -> float:
    return charts.HEIGHT - charts.BOTTOM


def test_stacked_bars_scale_to_the_tallest_stack_and_stack_in_order() -> None:
    root = parse(
        charts.stacked_bars(["a", "b", "c"], {"ok": [2, 0, 5], "dead": [2, 1, 0]}, COLOURS, title="ended")
    )
    drawn = bars(root)
    assert [(r.get("fill"), r.findtext(f"{SVG}title")) for r in drawn] == [
        ("#2f9e44", "a ok: 2"),
        ("#d6336c", "a dead: 2"),
        ("#d6336c", "b dead: 1"),
        ("#2f9e44", "c ok: 5"),
    ]
    plot_h = charts.HEIGHT - charts.TOP - charts.BOTTOM
    heights = [float(r.get("height", "0")) for r in drawn]
    assert heights == pytest.approx(
        [plot_h * 2 / 5, plot_h * 2 / 5, plot_h / 5, plot_h]
    )  # the axis tops at 5
    first, on_top = drawn[0], drawn[1]
    assert float(first.get("y", "0")) + heights[0] == pytest.approx(plot_bottom(), abs=0.1)
    assert float(on_top.get("y", "0")) + heights[1] == pytest.approx(float(first.get("y", "0")), abs=0.1)
    widths = {r.get("width") for r in drawn}
    assert len(widths) == 1
    assert root.findtext(f"{SVG}title") == "ended" and root.get("aria-label") == "ended"


def test_mean_max_bars_draw_the_max_behind_the_mean_and_skip_empty_minutes() -> None:
    root = parse(charts.mean_max_bars(["a", "b", "c"], [1.0, None, 4.0], [3.0, None, 8.0], title="run time"))
    drawn = bars(root)
    assert len(drawn) == 4  # two per minute with data
    plot_h = charts.HEIGHT - charts.TOP - charts.BOTTOM
    heights = [float(r.get("height", "0")) for r in drawn]
    assert heights == pytest.approx([plot_h * 3 / 10, plot_h / 10, plot_h * 8 / 10, plot_h * 4 / 10])
    assert drawn[0].findtext(f"{SVG}title") == "a: mean 1s, max 3s"
    assert all(
        float(r.get("y", "0")) + float(r.get("height", "0")) == pytest.approx(plot_bottom(), abs=0.1)
        for r in drawn
    )


def test_every_label_is_escaped() -> None:
    stacked = charts.stacked_bars([HOSTILE], {HOSTILE: [3]}, {HOSTILE: '"><script>x</script>'}, title=HOSTILE)
    means = charts.mean_max_bars([HOSTILE], [1.0], [2.0], title=HOSTILE, colour='"/><script>', max_colour="&")
    for svg in (stacked, means, charts.empty(HOSTILE, HOSTILE)):
        assert "<script" not in svg
        root = parse(svg)
        assert root.findtext(f"{SVG}title") == HOSTILE
    texts = [t.text for t in parse(stacked).iter(f"{SVG}text")]
    assert HOSTILE in texts  # the x label and the legend, back as they were given
    assert parse(stacked).findall(f".//{SVG}rect")[0].get("fill") == '"><script>x</script>'


@pytest.mark.parametrize(
    "svg",
    [
        charts.stacked_bars([], {}, COLOURS, title="t"),
        charts.stacked_bars(["a", "b"], {"ok": [0, 0]}, COLOURS, title="t"),
        charts.mean_max_bars([], [], [], title="t"),
        charts.mean_max_bars(["a"], [None], [None], title="t"),
    ],
)
def test_nothing_to_draw_is_said_not_drawn(svg: str) -> None:
    root = parse(svg)
    assert bars(root) == [] and root.findall(f".//{SVG}rect") == []
    assert [t.text for t in root.iter(f"{SVG}text")] == ["no data"]


def test_the_axis_tops_at_a_round_number_and_durations_read_short() -> None:
    assert [charts.nice_ceiling(v) for v in (0, 0.3, 1, 3, 7, 10, 11, 420, float("inf"))] == [
        1,
        0.5,
        1,
        5,
        10,
        10,
        20,
        500,
        1,
    ]
    assert [charts.seconds_text(v) for v in (0.25, 4.2, 5.0, 90, 7200)] == [
        "250ms",
        "4.2s",
        "5s",
        "1.5m",
        "2h",
    ]
    assert [charts.count_text(v) for v in (7, 1500, 2_000_000)] == ["7", "1.5k", "2M"]


def test_sixty_minutes_of_bars_fit_the_plot() -> None:
    labels = [f"12:{m:02d}" for m in range(60)]
    root = parse(charts.stacked_bars(labels, {"ok": list(range(60))}, COLOURS, title="t"))
    drawn = bars(root)
    assert len(drawn) == 59  # the first minute ended nothing
    right = max(float(r.get("x", "0")) + float(r.get("width", "0")) for r in drawn)
    assert right <= charts.WIDTH - charts.RIGHT + 0.5
    labels_shown = [t.text for t in root.iter(f"{SVG}text") if t.text and t.text.startswith("12:")]
    assert labels_shown == ["12:00", "12:10", "12:20", "12:30", "12:40", "12:50", "12:59"]
