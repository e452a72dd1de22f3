"""Inline SVG charts written by hand: horizontal bars (overlaid or stacked, linear or log scale) and a colour grid.

No plotting library and no script: the charts are static markup in the HTML page, readable with no network.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from markupsafe import Markup

LABEL_W, BAR_W, VALUE_W = 190, 470, 150
ROW_H, GROUP_H, AXIS_H, LEGEND_H = 20, 22, 26, 24
ENGINE_COLOURS = ["#3b6fb6", "#e08a2e", "#4a9a5b", "#b8474f", "#7b5ea7", "#8c6d4f", "#c462a4", "#6f7f8f",
                  "#b3a22a", "#2aa3b3"]
SHADES = ["#1f4e8c", "#6f9bd1", "#bcd2ee"]  # dark to light: median / slowest, or p50 / p95 / p99


def svg(chart: str) -> Markup:
    """A chart drawn here, to be placed in a Jinja2 page as it is: every text in it was escaped when it was drawn."""
    from markupsafe import Markup

    return Markup(chart)


@dataclass(frozen=True)
class Segment:
    value: float
    colour: str
    tip: str  # tooltip (an SVG <title>)


@dataclass(frozen=True)
class Bar:
    label: str
    segments: Sequence[Segment]
    text: str  # printed after the bar


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:g}" if value >= 1 else f"{value:.2g}"


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    exp = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * exp:
            return step * exp
    return 10 * exp


def _scale(values: Sequence[float], log: bool) -> tuple[list[float], Callable[[float], float]]:
    positive = [v for v in values if v > 0] or [1.0]
    if log:
        lo = 10 ** math.floor(math.log10(min(positive)))
        hi = 10 ** math.ceil(math.log10(max(positive)))
        if hi <= lo:
            hi = lo * 10
        span = math.log10(hi) - math.log10(lo)
        ticks = [lo * 10**i for i in range(round(span) + 1)]
        return ticks, lambda v: 0.0 if v <= lo else BAR_W * (math.log10(min(v, hi)) - math.log10(lo)) / span
    top = _nice_max(max(positive))
    ticks = [top * i / 4 for i in range(5)]
    return ticks, lambda v: BAR_W * max(0.0, min(v, top)) / top


LEGEND_CHAR_W = 7  # the widest a legend's 12px character is drawn, on average, in the page's sans-serif fonts
VALUE_CHAR_W = 6.5  # the same for an 11px value after a bar


def _start(chart_id: str, title: str, width: int, height: int, legend: Sequence[tuple[str, str]],
           left: int = LABEL_W) -> list[str]:
    """The opening of a chart: its element (an id the page and tests find it by), its title and its legend. The
    drawing widens to hold the legend whole (a narrow chart, e.g. a grid of one engine, has a long legend)."""
    items, lx = [], left
    for name, colour in legend:
        items.append(f'<rect x="{lx}" y="6" width="12" height="12" rx="2" fill="{colour}"/>'
                     f'<text x="{lx + 16}" y="16" class="legend">{escape(name)}</text>')
        lx += 28 + LEGEND_CHAR_W * len(name)
    width = max(width, lx)
    return [f'<svg id="{escape(chart_id)}" class="chart" role="img" viewBox="0 0 {width} {height}"'
            f' width="{width}" height="{height}">', f"<title>{escape(title)}</title>", *items]


def bars(chart_id: str, title: str, groups: Sequence[tuple[str, Sequence[Bar]]], *, legend: Sequence[tuple[str, str]],
         unit: str, log: bool = False, stacked: bool = False, reference: float | None = None) -> str:
    """Horizontal bars in groups. Overlaid segments each start at 0 (drawn largest first, so a median shows inside
    its slowest); stacked segments follow each other. `reference` draws a dashed line (e.g. 1.0 = the bare effect)."""
    totals = [sum(s.value for s in b.segments) if stacked else max((s.value for s in b.segments), default=0.0)
              for _, bs in groups for b in bs]
    every = [seg.value for _, bs in groups for b in bs for seg in b.segments]  # the smallest sets a log scale's start
    ticks, x = _scale([*totals, *every, *([reference] if reference else [])], log)
    rows = sum(len(bs) for _, bs in groups)
    height = LEGEND_H + GROUP_H * len(groups) + ROW_H * rows + AXIS_H
    longest = max((len(b.text) for _, bs in groups for b in bs), default=0)  # after the longest bar: held whole
    width = LABEL_W + BAR_W + max(VALUE_W, round(10 + VALUE_CHAR_W * longest))
    out = _start(chart_id, title, width, height, legend)
    y = LEGEND_H
    top = y
    for group, group_bars in groups:
        out.append(f'<text x="4" y="{y + 15}" class="group">{escape(group)}</text>')
        y += GROUP_H
        for bar in group_bars:
            out.append(f'<text x="{LABEL_W - 8}" y="{y + 14}" class="label" text-anchor="end">'
                       f"{escape(bar.label)}</text>")
            segments = list(bar.segments) if stacked else sorted(bar.segments, key=lambda s: -s.value)
            start = 0.0
            for seg in segments:
                left = x(start) if stacked else 0.0
                right = x(start + seg.value) if stacked else x(seg.value)
                w = max(right - left, 1.0 if seg.value > 0 else 0.0)
                out.append(f'<rect x="{LABEL_W + left:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW_H - 6}"'
                           f' fill="{seg.colour}"><title>{escape(seg.tip)}</title></rect>')
                if stacked:
                    start += seg.value
            end = x(start) if stacked else x(max((s.value for s in segments), default=0.0))
            out.append(f'<text x="{LABEL_W + end + 6:.1f}" y="{y + 14}" class="value">{escape(bar.text)}</text>')
            y += ROW_H
    for tick in ticks:
        tx = LABEL_W + x(tick)
        out.append(f'<line x1="{tx:.1f}" y1="{top}" x2="{tx:.1f}" y2="{y}" class="grid"/>'
                   f'<text x="{tx:.1f}" y="{y + 16}" class="tick" text-anchor="middle">{_fmt(tick)}</text>')
    if reference is not None:
        rx = LABEL_W + x(reference)
        out.append(f'<line x1="{rx:.1f}" y1="{top}" x2="{rx:.1f}" y2="{y}" class="reference"/>')
    out.append(f'<text x="{LABEL_W - 16}" y="{y + 16}" class="tick" text-anchor="end">'
               f"{escape(unit)}{' (log scale)' if log else ''} →</text>")
    out.append("</svg>")
    return "\n".join(out)


def colour_grid(chart_id: str, title: str, rows: Sequence[str], columns: Sequence[str],
                cells: dict[tuple[str, str], tuple[str, str, str]], legend: Sequence[tuple[str, str]]) -> str:
    """A grid of coloured cells; `cells[(row, column)]` = (short text, colour, tooltip)."""
    cell_w, cell_h = 130, 26
    label_w = max(LABEL_W, 16 + 7 * max((len(r) for r in rows), default=0))  # row titles are never cut
    width = label_w + cell_w * len(columns) + 10
    height = LEGEND_H + 22 + cell_h * len(rows) + 6
    out = _start(chart_id, title, width, height, legend, label_w)
    for j, column in enumerate(columns):
        out.append(f'<text x="{label_w + cell_w * j + cell_w / 2}" y="{LEGEND_H + 15}" class="label"'
                   f' text-anchor="middle">{escape(column)}</text>')
    for i, row in enumerate(rows):
        y = LEGEND_H + 22 + cell_h * i
        out.append(f'<text x="{label_w - 8}" y="{y + 17}" class="label" text-anchor="end">{escape(row)}</text>')
        for j, column in enumerate(columns):
            text, colour, tip = cells.get((row, column), ("not measured", "#e4e4e4", "not measured"))
            cx = label_w + cell_w * j
            out.append(f'<g><title>{escape(tip)}</title><rect x="{cx + 2}" y="{y + 2}" width="{cell_w - 4}"'
                       f' height="{cell_h - 4}" rx="4" fill="{colour}"/><text x="{cx + cell_w / 2}" y="{y + 17}"'
                       f' class="cell" text-anchor="middle">{escape(text)}</text></g>')
    out.append("</svg>")
    return "\n".join(out)
