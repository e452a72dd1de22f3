"""One self-contained HTML page from saved matrix and bench reports: inline CSS and SVG, no script, no URL.

Nothing in the page refers to anything outside it (no CDN, no font, no image file), so it opens the same with no
network. Every chart is drawn from the numbers in the reports by `svg`; every sentence in "What differs" comes from
`observations.differences`, i.e. from what the run measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from ... import __version__
from . import observations as obs
from .bench import engine_label, runs
from .engines import enable, state
from .html_bench import bench_section
from .svg import ENGINE_COLOURS, SHADES, Bar, Segment, bars, colour_grid
from .text import show

CSS = """
:root { --pass: #d8f0dd; --pass-ink: #1b6630; --fail: #f7d0d0; --fail-ink: #9b1c1c; --skip: #ececec;
  --skip-ink: #666; --ink: #1d2430; --muted: #5c6677; --line: #dde2ea; --accent: #1f4e8c; }
* { box-sizing: border-box; }
body { font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  color: var(--ink); margin: 0; background: #f6f7f9; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; background: #fff; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { font-size: 20px; margin: 36px 0 8px; border-bottom: 2px solid
  var(--line); padding-bottom: 4px; } h3 { font-size: 16px; margin: 22px 0 6px; }
p.lead, .muted { color: var(--muted); } code { font: 12.5px ui-monospace, SFMono-Regular, Menlo, monospace;
  background: #f1f3f6; padding: 1px 4px; border-radius: 3px; }
nav a { margin-right: 14px; color: var(--accent); text-decoration: none; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
thead th { background: #f1f3f6; position: sticky; top: 0; }
table.grid { line-height: 1.25; } table.grid td { text-align: center; padding: 0; min-width: 96px; }
table.grid td a { display: block; padding: 2px 8px; text-decoration: none; color: inherit; }
table.grid th { padding: 2px 8px; }
table.grid th[scope=row] { font-weight: normal; font-family: ui-monospace, SFMono-Regular, Menlo, monospace;
  font-size: 12.5px; }
td.passed { background: var(--pass); color: var(--pass-ink); } td.failed { background: var(--fail);
  color: var(--fail-ink); font-weight: bold; } td.skipped { background: var(--skip); color: var(--skip-ink); }
td.note a::after { content: " *"; }
table.num td { text-align: right; font-variant-numeric: tabular-nums; } table.num td:first-child { text-align: left; }
li:target, dt:target { background: #fff4c2; }
details.unavailable { margin: 10px 0; padding: 8px 12px; background: #f6f7f9; border: 1px solid var(--line);
  border-radius: 6px; } details summary { cursor: pointer; }
ul.differs li { margin: 4px 0; } dl.checks dt { font-family: ui-monospace, monospace; font-size: 12.5px;
  margin-top: 6px; } dl.checks dd { margin: 0 0 0 18px; color: var(--muted); }
svg.chart { display: block; margin: 8px 0 18px; max-width: 100%; height: auto; font-family: inherit; }
svg .group { font-weight: 600; font-size: 13px; fill: var(--ink); } svg .label, svg .legend { font-size: 12px;
  fill: var(--ink); } svg .value, svg .tick { font-size: 11px; fill: var(--muted); }
svg .value { paint-order: stroke; stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }
svg .cell { font-size: 11.5px; fill: #1d2430; } svg .grid { stroke: #e6e9ee; }
svg .reference { stroke: #b8474f; stroke-dasharray: 4 3; stroke-width: 1.5; }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; }
"""
SYMBOL = {"passed": "✓", "failed": "✗ failed", "skipped": "skipped"}


def kind(report: Mapping[str, Any]) -> str:
    """'matrix' (schema version 1), 'bench' (idem-dialects-bench/1 or -set/1) or 'engines'."""
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
            names += [n for n in (engine_label(r) for r in runs(report)) if n not in names]
    return {n: ENGINE_COLOURS[i % len(ENGINE_COLOURS)] for i, n in enumerate(names)}


def render_html(reports: Sequence[Mapping[str, Any]], sources: Sequence[str] = ()) -> str:
    palette = colours(reports)
    matrices = [r for r in reports if kind(r) == "matrix"]
    benches = [r for r in reports if kind(r) == "bench"]
    body: list[str] = []
    nav: list[tuple[str, str]] = []
    for i, report in enumerate(matrices):
        pfx = f"m{i + 1}-" if len(matrices) > 1 else ""
        nav += [(f"#{pfx}differs", "What differs"), (f"#{pfx}conformance", "Conformance"),
                (f"#{pfx}behaviour", "Behaviour")]
        body += matrix_sections(report, palette, pfx)
    if benches:
        nav.append(("#benchmark", "Benchmark"))
        body.append(bench_section(benches, palette))
    for report in (r for r in reports if kind(r) == "engines"):
        nav.append(("#catalogue", "Engines"))
        body.append(catalogue_section(report))
    engines = list(palette)
    head = (f"<h1>idem-dialects: engines compared</h1><p class=\"lead\">Idempotency keys in SQL on"
            f" {len(engines)} engine{'s' * (len(engines) != 1)} ({escape(', '.join(engines))}): what the conformance"
            " suite proved and measured, and what the protocol costs.</p>")
    nav_html = "<nav>" + "".join(f'<a href="{href}">{escape(text)}</a>' for href, text in nav) + "</nav>"
    footer = (f"<footer>Generated by idem-dialects {escape(__version__)} from "
              f"{escape(', '.join(sources) or 'the reports of this run')}. Self-contained: no script, no external"
              " resource.</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>idem-dialects report</title><style>{CSS}</style></head>\n<body><main>\n{head}\n{nav_html}\n"
            + "\n".join(body) + f"\n{footer}\n</main></body></html>\n")


def _anchor(pfx: str, check: str, engine: str) -> str:
    return f"{pfx}why-{check}--{engine}"


def matrix_sections(report: Mapping[str, Any], palette: Mapping[str, str], pfx: str = "") -> list[str]:
    ran, missing = obs.ran(report), obs.unavailable(report)
    engines = report["engines"]
    sentences = obs.differences(report)
    out = [f'<h2 id="{pfx}differs">What differs, from the measured observations</h2>',
           '<ul class="differs">' + "".join(f"<li>{escape(t)}</li>" for t in sentences) + "</ul>"
           if sentences else "<p>No engine recorded behaviour observations in this report.</p>"]
    out.append(f'<h2 id="{pfx}conformance">Conformance: {len(report["checks"])} checks &times; {len(ran)} engines</h2>')
    rows = "".join(f"<tr><th scope=\"row\">{escape(n)}</th><td>{escape(str(engines[n]['server_version']))}</td>"
                   f"<td>{escape(str(engines[n]['how']))}</td></tr>" for n in ran)
    out.append(f"<table><thead><tr><th>engine</th><th>version</th><th>provided by</th></tr></thead>{rows}</table>")
    if missing:
        items = "".join(
            f"<li><b>{escape(n)}</b> ({escape(str(engines[n]['title']))}): {escape(str(engines[n]['reason']))}"
            f"<br>to enable: {escape(str(engines[n]['hint'] or 'set ' + str(engines[n]['env_var'])))}</li>"
            for n in missing)
        out.append(f'<details class="unavailable" id="{pfx}unavailable"><summary>{len(missing)} engine'
                   f"{'s' * (len(missing) != 1)} not available here, every check skipped:"
                   f" {escape(', '.join(missing))} — how to enable them</summary><ul>{items}</ul></details>")
    out.append(f"<p>{escape(obs.tally(report))}. Each cell links to its reason.</p>")
    head = "".join(f"<th>{escape(n)}</th>" for n in ran)
    body, reasons = [], []
    for check in report["checks"]:
        cells = []
        for n in ran:
            cell = check["results"].get(n)
            if cell is None:
                cells.append('<td class="skipped">—</td>')
                continue
            outcome, reason = cell["outcome"], cell.get("reason")
            target = _anchor(pfx, check["id"], n) if reason else f"{pfx}check-{check['id']}"
            tip = f"{check['id']} on {n}: {outcome}" + (f" — {reason}" if reason else f" in {cell['duration']} s")
            if reason:
                reasons.append(f'<li id="{target}"><code>{escape(check["id"])}</code> on <b>{escape(n)}</b>:'
                               f" {escape(outcome)} — {escape(reason)}</li>")
            css = f"{outcome} note" if reason else outcome
            cells.append(f'<td class="{css}"><a href="#{escape(target)}" title="{escape(tip)}">'
                         f"{SYMBOL[outcome]}</a></td>")
        body.append(f'<tr><th scope="row"><a href="#{pfx}check-{escape(check["id"])}">{escape(check["id"])}</a></th>'
                    + "".join(cells) + "</tr>")
    out.append(f'<table class="grid" id="{pfx}grid"><thead><tr><th>check</th>{head}</tr></thead><tbody>'
               + "".join(body) + "</tbody></table>")
    if reasons:
        out.append(f"<h3>Reasons (cells marked *)</h3><ul class=\"reasons\">{''.join(reasons)}</ul>")
    checks = "".join(f'<dt id="{pfx}check-{escape(c["id"])}">{escape(c["id"])}</dt><dd>{escape(c["statement"])}'
                     f" <span class=\"muted\">({escape(_outcomes(c, ran))})</span></dd>" for c in report["checks"])
    out.append(f'<details><summary>What each check proves</summary><dl class="checks">{checks}</dl></details>')
    out += behaviour(report, palette, pfx)
    return out


def _outcomes(check: Mapping[str, Any], ran: Sequence[str]) -> str:
    counts: dict[str, list[str]] = {}
    for n in ran:
        cell = check["results"].get(n)
        if cell:
            counts.setdefault(cell["outcome"], []).append(n)
    return "; ".join(f"{o} on {', '.join(ns)}" for o, ns in counts.items())


def behaviour(report: Mapping[str, Any], palette: Mapping[str, str], pfx: str = "") -> list[str]:
    out = [f'<h2 id="{pfx}behaviour">Behaviour, measured in this run</h2>']
    lat = obs.latency(report)
    if lat:
        groups = [(obs.title(label),
                   [Bar(e, [Segment(med, SHADES[0], f"{e}, {label}: median caller {med:g} ms"),
                            Segment(slow, SHADES[2], f"{e}, {label}: slowest caller {slow:g} ms")],
                        f"median {med:g} · slowest {slow:g} ms") for e, (med, slow) in per.items()])
                  for label, per in lat.items()]
        out.append("<h3>Caller latency in the same-key race (16 threads on one key), per isolation level</h3>")
        out.append(bars(f"{pfx}chart-latency", "caller latency per isolation level per engine", groups,
                        legend=[("median caller", SHADES[0]), ("slowest caller", SHADES[2])], unit="ms", log=True))
    every = obs.retries(report)
    tries = {label: per for label, per in every.items() if any(per.values())}
    calm = [label for label in every if label not in tries]
    if every:
        causes = sorted({c for per in tries.values() for by in per.values() for c in by})
        cause_colour = {c: ENGINE_COLOURS[(i + 3) % len(ENGINE_COLOURS)] for i, c in enumerate(causes)}
        groups = [(label, [Bar(e, [Segment(n, cause_colour[c], f"{e}, {label}: {c} x{n}") for c, n in by.items()],
                               ", ".join(f"{c} x{n}" for c, n in by.items()) or "none")
                           for e, by in per.items()]) for label, per in tries.items()]
        groups = [(obs.title(label), bars_) for label, bars_ in groups]
        out.append("<h3>Retries absorbed by <code>run</code>, by cause</h3>")
        if calm:
            quiet = ", ".join(obs.title(c) for c in calm)
            out.append(f"<p class=\"muted\">No retry on any engine: {escape(quiet)}.</p>")
        out.append(bars(f"{pfx}chart-retries", "retries absorbed by cause", groups,
                        legend=[(c, cause_colour[c]) for c in causes] or [("no retries", "#e4e4e4")],
                        unit="retries", stacked=True))
    how = obs.resolution(report)
    if how:
        ran = obs.ran(report)
        cells = {(obs.title(label), e): (("waited" if kind_ == obs.WAITED else "retried"),
                              "#cfe8d5" if kind_ == obs.WAITED else "#f6d7b0", f"{e}, {label}: {text}")
                 for label, per in how.items() for e, (kind_, text) in per.items()}
        out.append("<h3>How concurrent duplicates were resolved: waited on the key vs retried</h3>")
        out.append(colour_grid(f"{pfx}chart-duplicates", "duplicates resolved: waited vs retried",
                               [obs.title(label) for label in how], ran,
                               cells, legend=[("waited on the key, then replayed", "#cfe8d5"),
                                              ("retried, then replayed", "#f6d7b0")]))
    calls = obs.effect_calls(report)
    out.append("<h3>Effect-callable calls per key</h3>")
    if calls:
        groups = [(name, [Bar(e, [Segment(v, palette.get(e, SHADES[0]), f"{e}: {text}")], f"{v:g}")
                          for e, (v, text) in per.items()]) for name, per in calls.items()]
        out.append(bars(f"{pfx}chart-effect-calls", "effect-callable calls per key", groups, legend=[],
                        unit="calls per key", reference=1.0))
    else:
        out.append("<p class=\"muted\">No engine in this report measured it (cluster engines such as Galera report"
                   " how often the effect callable ran per key; on a single server it is 1).</p>")
    rows = []
    ran = obs.ran(report)
    names: list[str] = []
    for e in ran:
        names += [k for k in report["observations"].get(e, {}) if k not in names]
    for name in names:
        rows.append(f"<tr><th scope=\"row\">{escape(name)}</th>" + "".join(
            f"<td>{escape(show(report['observations'].get(e, {}).get(name)))}</td>" for e in ran) + "</tr>")
    out.append("<details><summary>Every observation, as recorded</summary><table><thead><tr><th>observation</th>"
               + "".join(f"<th>{escape(e)}</th>" for e in ran) + "</tr></thead>" + "".join(rows) + "</table>"
               "</details>")
    return out


def catalogue_section(report: Mapping[str, Any]) -> str:
    """`idem-dialects engines --format json`: each catalogue engine, how it would be provided, or (probed) whether it
    is available here and what would enable it."""
    rows = []
    for name, e in report["engines"].items():
        word, text = state(e)
        if word == "unavailable":
            text += f"; to enable: {enable(e)}"
        css = {"available": "passed", "unavailable": "skipped"}.get(word, "")
        rows.append(f'<tr><th scope="row">{escape(name)}</th><td class="{css}">{escape(word)}</td>'
                    f"<td>{escape(text)}</td></tr>")
    return ('<h2 id="catalogue">Engines of the catalogue</h2><table><thead><tr><th>engine</th><th>status</th>'
            "<th>how / why not</th></tr></thead>" + "".join(rows) + "</table>")
