"""`idem-dialects report`: render saved JSON reports of `matrix` and `bench` as a table, markdown or one HTML file.

`--format` defaults to html when `-o` names a .html file (markdown for .md), else table. Several files: text formats
render each in turn; html puts them all on one self-contained page.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..output import add_output, add_quiet, write
from . import EXIT_OK, EXIT_USAGE

FORMATS = ("table", "markdown", "html", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="JSON report of `matrix --format json` or `bench --format json` (repeatable)")
    parser.add_argument("--format", choices=FORMATS,
                        help="table, markdown, html (one self-contained page) or json; default: from -o's suffix"
                             " (.html, .md), else table")
    add_output(parser, "the rendered report")
    add_quiet(parser, "accepted as every report command does; report prints no progress")
    parser.add_argument("--show-skipped", action="store_true",
                        help="table/markdown: a column and a line (reason, how to enable) per unavailable engine")


def run(args: argparse.Namespace) -> int:
    from ..reporting import load_reports, render, render_html

    fmt = args.format or {".html": "html", ".htm": "html", ".md": "markdown"}.get(
        Path(args.output).suffix.lower() if args.output else "", "table")
    try:
        reports = load_reports(args.files)
    except ValueError as exc:
        print(f"idem-dialects report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if fmt == "html":
        text = render_html(reports, [Path(f).name for f in args.files])
    elif fmt == "json" and len(reports) > 1:  # one JSON document: the reports in a list
        text = json.dumps(reports, indent=2, ensure_ascii=False) + "\n"
    else:
        text = "\n".join(render(r, fmt, show_skipped=args.show_skipped) for r in reports)
    write(text, args.output)
    return EXIT_OK
