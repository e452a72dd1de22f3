"""`idem-dialects engines`: every engine of the catalogue, whether it can be had here, how, or why not."""

from __future__ import annotations

import argparse
import sys

from ..reporting import render
from .matrix import provision


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", action="append", metavar="NAME", help="only these engines (repeatable)")
    parser.add_argument("--format", choices=("table", "markdown", "json"), default="table")


def run(args: argparse.Namespace) -> int:
    """Provide each engine (starting an embedded server for a moment if that is how), then stop it at once."""
    from ..engines import expand  # type: ignore[import-not-found, unused-ignore]

    try:
        names = expand(args.engine or ["all"])
    except KeyError as exc:
        print(f"idem-dialects engines: {exc.args[0]}", file=sys.stderr)
        return 2
    found = {}
    for name in names:
        status = provision(name, {})
        if status.server is not None:
            status.server.stop()
        found[name] = status.as_json()
    report = {"version": 1, "engines": found}
    print(render(report, args.format), end="")
    return 0
