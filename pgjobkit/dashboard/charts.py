"""Charts as inline SVG text, drawn by pure functions: stacked bars of counts, and bars of a mean under a
maximum. No script and no style element (the page's CSP allows neither): colours are attributes, and
every piece of text is escaped."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 640, 160  # the default drawing, in SVG units (the page scales it to its box)
LEFT, RIGHT, TOP, BOTTOM = 48, 10, 10, 24  # margins around the plot: axis labels sit in them
LEGEND = 22  # the legend's row, under the axis labels
GRID = "#e3e6ea"
INK = "#5b6470"
# axis tops for durations past a minute: whole minutes, then hours, as a clock reads
_DURATION_TOPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 18000, 36000, 86400)


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 (times a power of ten) at or above ``value``: an axis's top (1 for 0)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return float(next(step * power for step in (1, 2, 5, 10) if value <= step * power * (1 + 1e-9)))


def nice_seconds(value: float) -> float:
    """An axis's top for durations: ``nice_ceiling`` up to a minute, then 1, 2, 5, 10, 15, 30 minutes, 1,
    2, 5, 10 hours, a day."""
    if value <= 60 or not math.isfinite(value):
        return min(nice_ceiling(value), 60.0)
    return float(next((top for top in _DURATION_TOPS if value <= top), nice_ceiling(value)))


def seconds_text(value: float) -> str:
    """A duration short enough for an axis: 0, 250ms, 4.2s, 3.5m, 1.2h."""
    if value <= 0:
        return "0"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 60:
        return f"{value:.1f}s".replace(".0s", "s")
    if value < 3600:
        return f"{value / 60:.1f}m".replace(".0m", "m")
    return f"{value / 3600:.1f}h".replace(".0h", "h")


def count_text(value: float) -> str:
    """A count for an axis: 7, 1.5k, 2M."""
    if value < 1000:
        return f"{value:g}"
    if value < 1_000_000:
        return f"{value / 1000:g}k"
    return f"{value / 1_000_000:g}M"


def _frame(title: str, width: int, height: int, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{_e(title)}">'
        f"<title>{_e(title)}</title>" + "".join(body) + "</svg>"
    )


def empty(title: str, message: str = "no data", width: int = WIDTH) -> str:
    """A small chart that says there is nothing to draw."""
    return _frame(
        title,
        width,
        60,
        [
            f'<text x="{width / 2:.0f}" y="34" text-anchor="middle" font-size="13" fill="{INK}">'
            f"{_e(message)}</text>"
        ],
    )


def _axes(width: int, top: float, labels: Sequence[str], tick_every: int, fmt: str) -> list[str]:
    """Grid lines at 0, half and the top, with their values, and every ``tick_every``-th x label (and the
    last, right-aligned to its bar)."""
    plot_w, plot_h = width - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    out = []
    for fraction in (0.0, 0.5, 1.0):
        y = TOP + plot_h * (1 - fraction)
        value = top * fraction
        text = seconds_text(value) if fmt == "seconds" else count_text(value)
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{width - RIGHT}" y2="{y:.1f}" stroke="{GRID}" '
            'stroke-width="1"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="12" fill="{INK}">'
            f"{_e(text)}</text>"
        )
    step = plot_w / max(len(labels), 1)
    last = len(labels) - 1
    for i, label in enumerate(labels):
        if i == last:
            x, anchor = LEFT + step * (i + 1), "end"
        elif i == 0:
            x, anchor = LEFT, "start"
        elif i % tick_every == 0 and (last - i) * step > 48:  # leaves room for the last label
            x, anchor = LEFT + step * (i + 0.5), "middle"
        else:
            continue
        out.append(
            f'<text x="{x:.1f}" y="{HEIGHT - 7}" text-anchor="{anchor}" font-size="12" '
            f'fill="{INK}">{_e(label)}</text>'
        )
    return out


def _legend(entries: Sequence[tuple[str, str]]) -> list[str]:
    out, x = [], LEFT
    for name, colour in entries:
        out.append(
            f'<rect x="{x}" y="{HEIGHT + 6}" width="11" height="11" rx="2" fill="{_e(colour)}"/>'
            f'<text x="{x + 15}" y="{HEIGHT + 16}" font-size="12" fill="{INK}">{_e(name)}</text>'
        )
        x += 26 + 7 * len(name)
    return out


def stacked_bars(
    labels: Sequence[str],
    stacks: Mapping[str, Sequence[int]],
    colours: Mapping[str, str],
    *,
    title: str,
    width: int = WIDTH,
    tick_every: int = 10,
) -> str:
    """One bar per label, stacked by series (in ``stacks``' order, coloured by ``colours``); each piece
    carries a tooltip (label, series, count). Nothing to count: ``empty``."""
    totals = [sum(series[i] for series in stacks.values()) for i in range(len(labels))]
    if not labels or max(totals, default=0) <= 0:
        return empty(title, width=width)
    top = nice_ceiling(max(totals))
    plot_w, plot_h = width - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / len(labels)
    body = _axes(width, top, labels, tick_every, "count")
    for i, label in enumerate(labels):
        base = 0
        for name, series in stacks.items():
            n = series[i]
            if n <= 0:
                continue
            h = plot_h * n / top
            body.append(
                f'<rect x="{LEFT + step * i + 0.5:.1f}" y="{TOP + plot_h * (1 - (base + n) / top):.1f}" '
                f'width="{max(step - 1, 0.5):.1f}" height="{h:.1f}" fill="{_e(colours.get(name, INK))}">'
                f"<title>{_e(label)} {_e(name)}: {n}</title></rect>"
            )
            base += n
    body += _legend([(name, colours.get(name, INK)) for name in stacks])
    return _frame(title, width, HEIGHT + LEGEND + 4, body)


def mean_max_bars(
    labels: Sequence[str],
    means: Sequence[float | None],
    maxima: Sequence[float | None],
    *,
    title: str,
    width: int = WIDTH,
    colour: str = "#1f6feb",
    max_colour: str = "#b6d0f5",
    tick_every: int = 10,
) -> str:
    """Seconds per label: a light bar up to the maximum, a dark one up to the mean, and a tooltip with
    both (None: nothing that minute). Nothing to draw: ``empty``."""
    points = [(i, m, x) for i, (m, x) in enumerate(zip(means, maxima, strict=True)) if m is not None]
    if not labels or not points:
        return empty(title, width=width)
    top = nice_seconds(max(max(m, x if x is not None else m) for _, m, x in points))
    plot_w, plot_h = width - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / len(labels)
    body = _axes(width, top, labels, tick_every, "seconds")
    for i, mean, high in points:
        high = max(high if high is not None else mean, mean)
        x, w = LEFT + step * i + 0.5, max(step - 1, 0.5)
        tip = f"<title>{_e(labels[i])}: mean {_e(seconds_text(mean))}, max {_e(seconds_text(high))}</title>"
        for value, fill in ((high, max_colour), (mean, colour)):
            h = plot_h * min(value / top, 1.0)
            body.append(
                f'<rect x="{x:.1f}" y="{TOP + plot_h - h:.1f}" width="{w:.1f}" height="{h:.1f}" '
                f'fill="{_e(fill)}">{tip}</rect>'
            )
    body += _legend([("mean", colour), ("max", max_colour)])
    return _frame(title, width, HEIGHT + LEGEND + 4, body)
