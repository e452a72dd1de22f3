"""The matrix report (schema version 1) as a terminal table or GitHub markdown.

The terminal table fits `WIDTH` columns: each column is headed by its engine's name (stacked over a few lines where
it is long), engines that could not be had are one summary line (each with its reason and a column in the grid
only with `show_skipped`), each distinct reason a cell refers to is one wrapped footnote, and observations whose
values do not fit a grid column are listed one engine per line under their name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .observations import ran, tally, unavailable
from .text import WIDTH, heading, keyed_lines, show, stacked_table, table, wrap

SYMBOL = {"passed": "✓", "failed": "✗", "skipped": "skip"}


def render_matrix(report: Mapping[str, Any], fmt: str = "table", *, show_skipped: bool = False,
                  width: int = WIDTH) -> str:
    markdown = fmt == "markdown"
    engines = report["engines"]
    available, missing = ran(report), unavailable(report)
    columns = available + (missing if show_skipped else [])
    out = [heading("Engines", markdown), ""]
    rows = [(name, f"{e['how']} — {e['server_version']}") for name, e in engines.items() if e["available"]]
    if show_skipped:
        rows += [(name, f"unavailable: {e['reason']}" + (f" (to enable: {e['hint']})" if e["hint"] else ""))
                 for name, e in engines.items() if not e["available"]]
    if markdown:
        out += table(["engine", "how / why not"], [list(r) for r in rows], markdown=True)
    else:
        out += keyed_lines(rows, width)
    held = [n for n in missing if engines[n].get("on_request")]  # not started: nobody asked for them
    absent = [n for n in missing if n not in held]
    if held and not show_skipped:
        line = (f"Not run unless asked for ({len(held)}): {', '.join(held)}. Each starts a cluster or a container:"
                " `idem-dialects matrix --engine NAME` runs one, `--engine all` every engine.")
        out += ["", *wrap(line, width=width)]
    if absent and not show_skipped:
        line = (f"Not available here, every check skipped ({len(absent)}): {', '.join(absent)}."
                " `idem-dialects engines` says how to enable each (or add --show-skipped).")
        out += ["", *wrap(line, width=width)]
    out += ["", heading(f"Checks ({len(report['checks'])}) x engines", markdown), ""]
    out += _grid(report, columns, markdown, width)
    out += ["", heading("Behaviour (measured in this run)", markdown), ""]
    out += _behaviour(report, available, markdown, width)
    out += ["", *wrap(tally(report), width=width)]
    return "\n".join(out) + "\n"


def _grid(report: Mapping[str, Any], columns: list[str], markdown: bool, width: int) -> list[str]:
    notes: list[str] = []

    def note(text: str) -> str:
        # One note per distinct reason, whatever the checks and engines that share it (their cells show which).
        if text not in notes:
            notes.append(text)
        return f"[{notes.index(text) + 1}]"

    grid = []
    for check in report["checks"]:
        row = [check["id"]] + ([check["statement"]] if markdown else [])
        for name in columns:
            cell = check["results"].get(name)
            if cell is None:
                row.append("—")
                continue
            text = SYMBOL[cell["outcome"]]
            if cell["reason"] and (cell["outcome"] != "skipped" or name not in unavailable(report)):
                text += " " + note(cell["reason"])
            row.append(text)
        grid.append(row)
    if markdown:
        lines = table(["check", "guarantee", *columns], grid, markdown=True)
    else:
        lines = stacked_table("check", columns, grid, width)
    if notes:
        lines.append("")
        for i, text in enumerate(notes, 1):
            lines += [f"- [{i}] {text}"] if markdown else wrap(text, "     ", first=f"[{i}]".ljust(5), width=width)
    return lines


def _behaviour(report: Mapping[str, Any], engines: list[str], markdown: bool, width: int) -> list[str]:
    names: list[str] = []
    for name in engines:
        names += [k for k in report["observations"].get(name, {}) if k not in names]
    values = {obs: [show(report["observations"].get(e, {}).get(obs)) for e in engines] for obs in names}
    if markdown:
        return table(["observation", *engines], [[obs, *vals] for obs, vals in values.items()], markdown=True)
    if not engines:
        return ["(no engine ran)"]
    # A value that does not fit its share of the width sends its observation to the long list below.
    name_width = min(44, max(len(n) for n in names) if names else 11)
    cell = max(max(len(e) for e in engines), (width - name_width - 2 * len(engines)) // len(engines))
    short = {o: v for o, v in values.items() if len(o) <= name_width and all(len(x) <= cell for x in v)}
    long = {o: v for o, v in values.items() if o not in short}
    lines = table(["observation", *engines], [[o, *v] for o, v in short.items()], markdown=False) if short else []
    if lines and max(len(line) for line in lines) > width:  # engine names alone are too wide: one list for all
        lines, long = [], values
    for obs, vals in long.items():
        lines += ["", *wrap(obs, "  ", width=width)]
        rows = [(f"  {e}", v) for e, v in zip(engines, vals, strict=True)]
        same = len(set(vals)) == 1 and len(engines) > 1
        lines += keyed_lines([("  all engines", vals[0])] if same else rows, width)
    return lines
