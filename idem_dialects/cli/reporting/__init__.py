"""Rendering every report of idem-dialects: matrix, bench and engines, as table, markdown, json or html.

The commands build report dictionaries (their JSON schemas are documented in the docs: Conformance and Benchmarks); this
package only turns them into text, so `idem-dialects report` can render a saved JSON report exactly as the command
that produced it would have. A bench report is rendered by the benchmark harness that wrote it (`bench_renderer`,
another distribution).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .engines import render_engines
from .html import bench_renderer, kind, render_html
from .matrix import render_matrix
from .text import WIDTH

FORMATS = ("table", "markdown", "json", "html")

__all__ = ["FORMATS", "WIDTH", "bench_renderer", "kind", "load", "render", "render_engines", "render_html",
           "render_matrix"]


def render(report: Mapping[str, Any], fmt: str, *, show_skipped: bool = False) -> str:
    """One report in `fmt`; json is the report itself (indented), html a self-contained page."""
    if fmt == "json":
        return json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    if fmt == "html":
        return render_html([report])
    what = kind(report)
    if what == "matrix":
        return render_matrix(report, fmt, show_skipped=show_skipped)
    if what == "bench":
        return str(bench_renderer().render(report, fmt))
    return render_engines(report, fmt)


def load_reports(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Saved JSON reports; ValueError naming the file for anything that is not one."""
    reports = []
    for path in paths:
        try:
            report = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"{path}: cannot read it: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(report, dict):
            raise ValueError(f"{path}: not a report of idem-dialects matrix or bench")
        try:
            kind(report)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        reports.append(report)
    return reports
