"""One self-contained HTML page from saved matrix, bench and engines reports: inline CSS and SVG, no script, no URL.

The page is Jinja2 templates (templates/, package data, autoescaped); this module turns each report into what the
templates show. Nothing in the page refers to anything outside it (no CDN, no font, no image file), so it opens the
same with no network. Every chart is drawn from the numbers in the reports by `svg`; every sentence in "What differs"
comes from `observations.differences`, i.e. from what the run measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

from ... import __version__
from ...errors import ConfigurationError
from ..plugins import REPORT_GROUP, plugin
from . import observations as obs
from .engines import enable, state
from .svg import ENGINE_COLOURS, SHADES, Bar, Segment, bars, colour_grid, svg
from .text import show

if TYPE_CHECKING:
    from jinja2 import Environment

SYMBOL = {"passed": "✓", "failed": "✗ failed", "skipped": "skipped"}


class BenchRenderer(Protocol):
    """What the benchmark harness registers as `bench` in the idem_dialects.reports entry-point group."""

    def render(self, report: Mapping[str, Any], fmt: str) -> str: ...

    def engine_names(self, report: Mapping[str, Any]) -> list[str]: ...

    def html_section(self, reports: Sequence[Mapping[str, Any]], palette: Mapping[str, str]) -> str: ...


def bench_renderer() -> BenchRenderer:
    """The renderer of bench reports, from the benchmark harness (NotInstalled, saying what to install, without)."""
    renderer: BenchRenderer = plugin(REPORT_GROUP, "bench")
    return renderer


@cache
def environment(package: str = "idem_dialects.cli.reporting") -> Environment:
    """The templates of `package` (its templates/ directory; the page's are this package's), loaded when a page is
    rendered: jinja2, the [report] extra, is imported only then."""
    try:
        from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
    except ImportError:
        raise ConfigurationError("the HTML report needs Jinja2: pip install 'idem-dialects[report]'") from None

    env = Environment(loader=PackageLoader(package, "templates"),
                      autoescape=select_autoescape(["html.j2"]), undefined=StrictUndefined, trim_blocks=True,
                      lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["counted"] = counted
    return env


def counted(n: int, word: str) -> str:
    """'1 engine', '2 engines' (a template's `n | counted("engine")`)."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def kind(report: Mapping[str, Any]) -> str:
    """'matrix' (schema version 1), 'bench' (idem-dialects-bench*/1) or 'engines'."""
    if str(report.get("schema", "")).startswith("idem-dialects-bench"):
        return "bench"
    if "checks" in report and "engines" in report:
        return "matrix"
    if "engines" in report:
        return "engines"
    raise ValueError("not a report of idem-dialects matrix or bench (no 'checks' or bench 'schema')")


def colours(reports: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """One colour per engine name across the whole page."""
    names: list[str] = []
    for report in reports:
        if kind(report) == "matrix":
            names += [n for n in obs.ran(report) if n not in names]
        elif kind(report) == "bench":
            names += [n for n in bench_renderer().engine_names(report) if n not in names]
    return {n: ENGINE_COLOURS[i % len(ENGINE_COLOURS)] for i, n in enumerate(names)}


def render_html(reports: Sequence[Mapping[str, Any]], sources: Sequence[str] = ()) -> str:
    palette = colours(reports)
    matrices = [r for r in reports if kind(r) == "matrix"]
    benches = [r for r in reports if kind(r) == "bench"]
    catalogues = [catalogue_rows(r) for r in reports if kind(r) == "engines"]
    nav: list[tuple[str, str]] = []
    views = []
    for i, report in enumerate(matrices):
        pfx = f"m{i + 1}-" if len(matrices) > 1 else ""
        nav += [(f"#{pfx}differs", "What differs"), (f"#{pfx}conformance", "Conformance"),
                (f"#{pfx}behaviour", "Behaviour")]
        views.append(matrix_view(report, palette, pfx))
    if benches:
        nav.append(("#benchmark", "Benchmark"))
    nav += [("#catalogue", "Engines")] * len(catalogues)
    return environment().get_template("report.html.j2").render(
        version=__version__, engines=list(palette), nav=nav, matrices=views,
        bench=bench_renderer().html_section(benches, palette) if benches else None, catalogues=catalogues,
        sources=list(sources))


def _anchor(pfx: str, check: str, engine: str) -> str:
    return f"{pfx}why-{check}--{engine}"


def matrix_view(report: Mapping[str, Any], palette: Mapping[str, str], pfx: str = "") -> dict[str, Any]:
    """What matrix.html.j2 shows of one matrix report: the grid's cells with their links and reasons."""
    ran = obs.ran(report)
    grid, reasons = [], []
    for check in report["checks"]:
        cells: list[dict[str, str] | None] = []
        for n in ran:
            cell = check["results"].get(n)
            if cell is None:
                cells.append(None)
                continue
            outcome, reason = cell["outcome"], cell.get("reason")
            target = _anchor(pfx, check["id"], n) if reason else f"{pfx}check-{check['id']}"
            if reason:
                reasons.append({"target": target, "check": check["id"], "engine": n, "outcome": outcome,
                                "reason": reason})
            cells.append({"css": f"{outcome} note" if reason else outcome, "target": target, "symbol": SYMBOL[outcome],
                          "tip": f"{check['id']} on {n}: {outcome}"
                                 + (f" — {reason}" if reason else f" in {cell['duration']} s")})
        grid.append({"id": check["id"], "cells": cells})
    checks = [{"id": c["id"], "statement": c["statement"], "outcomes": _outcomes(c, ran)} for c in report["checks"]]
    return {"pfx": pfx, "sentences": obs.differences(report), "ran": ran, "missing": obs.unavailable(report),
            "engines": report["engines"], "tally": obs.tally(report), "grid": grid, "reasons": reasons,
            "checks": checks, "behaviour": behaviour(report, palette, pfx)}


def _outcomes(check: Mapping[str, Any], ran: Sequence[str]) -> str:
    counts: dict[str, list[str]] = {}
    for n in ran:
        cell = check["results"].get(n)
        if cell:
            counts.setdefault(cell["outcome"], []).append(n)
    return "; ".join(f"{o} on {', '.join(ns)}" for o, ns in counts.items())


def behaviour(report: Mapping[str, Any], palette: Mapping[str, str], pfx: str = "") -> dict[str, Any]:
    """The behaviour charts (None where the report measured nothing for one) and every observation as recorded."""
    view: dict[str, Any] = {"latency": None, "retries": None, "calm": [], "duplicates": None, "calls": None}
    lat = obs.latency(report)
    if lat:
        groups = [(obs.title(label),
                   [Bar(e, [Segment(med, SHADES[0], f"{e}, {label}: median caller {med:g} ms"),
                            Segment(slow, SHADES[2], f"{e}, {label}: slowest caller {slow:g} ms")],
                        f"median {med:g} · slowest {slow:g} ms") for e, (med, slow) in per.items()])
                  for label, per in lat.items()]
        view["latency"] = svg(bars(f"{pfx}chart-latency", "caller latency per isolation level per engine", groups,
                                   legend=[("median caller", SHADES[0]), ("slowest caller", SHADES[2])], unit="ms",
                                   log=True))
    every = obs.retries(report)
    tries = {label: per for label, per in every.items() if any(per.values())}
    if every:
        causes = sorted({c for per in tries.values() for by in per.values() for c in by})
        cause_colour = {c: ENGINE_COLOURS[(i + 3) % len(ENGINE_COLOURS)] for i, c in enumerate(causes)}
        groups = [(obs.title(label), [Bar(e, [Segment(n, cause_colour[c], f"{e}, {label}: {c} x{n}")
                                              for c, n in by.items()], ", ".join(f"{c} x{n}" for c, n in by.items())
                                          or "none") for e, by in per.items()]) for label, per in tries.items()]
        view["calm"] = [obs.title(label) for label in every if label not in tries]
        view["retries"] = svg(bars(f"{pfx}chart-retries", "retries absorbed by cause", groups,
                                   legend=[(c, cause_colour[c]) for c in causes] or [("no retries", "#e4e4e4")],
                                   unit="retries", stacked=True))
    how = obs.resolution(report)
    if how:
        cells = {(obs.title(label), e): (("waited" if kind_ == obs.WAITED else "retried"),
                                         "#cfe8d5" if kind_ == obs.WAITED else "#f6d7b0", f"{e}, {label}: {text}")
                 for label, per in how.items() for e, (kind_, text) in per.items()}
        view["duplicates"] = svg(colour_grid(f"{pfx}chart-duplicates", "duplicates resolved: waited vs retried",
                                             [obs.title(label) for label in how], obs.ran(report), cells,
                                             legend=[("waited on the key, then replayed", "#cfe8d5"),
                                                     ("retried, then replayed", "#f6d7b0")]))
    calls = obs.effect_calls(report)
    if calls:
        groups = [(name, [Bar(e, [Segment(v, palette.get(e, SHADES[0]), f"{e}: {text}")], f"{v:g}")
                          for e, (v, text) in per.items()]) for name, per in calls.items()]
        view["calls"] = svg(bars(f"{pfx}chart-effect-calls", "effect-callable calls per key", groups, legend=[],
                                 unit="calls per key", reference=1.0))
    ran = obs.ran(report)
    names: list[str] = []
    for e in ran:
        names += [k for k in report["observations"].get(e, {}) if k not in names]
    view["observations"] = [(name, [show(report["observations"].get(e, {}).get(name)) for e in ran])
                            for name in names]
    return view


def catalogue_rows(report: Mapping[str, Any]) -> list[dict[str, str]]:
    """`idem-dialects engines --format json`: each catalogue engine, how it would be provided, or (probed) whether it
    is available here and what would enable it."""
    rows = []
    for name, e in report["engines"].items():
        word, text = state(e)
        rows.append({"name": name, "word": word, "css": {"available": "passed", "unavailable": "skipped"}.get(word, ""),
                     "text": f"{text}; to enable: {enable(e)}" if word == "unavailable" else text})
    return rows
