"""`idem-dialects engines`: every engine of the catalogue, whether it can be had here, how, or why not."""

from __future__ import annotations

import argparse
import sys

from ...engines import expand, provision
from ..reporting import render
from . import EXIT_OK, EXIT_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", action="append", metavar="NAME", help="only these engines (repeatable)")
    parser.add_argument("--format", choices=("table", "markdown", "json"), default="table")


def run(args: argparse.Namespace) -> int:
    """Provide each engine (starting an embedded server for a moment if that is how), then stop it at once."""
    try:
        names = expand(args.engine or ["all"])
    except KeyError as exc:
        print(f"idem-dialects engines: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    found = {}
    for name in names:
        status = provision(name, {})
        if status.server is not None:
            status.server.stop()
        found[name] = status.as_json()
    print(render({"version": 1, "engines": found}, args.format), end="")
    return EXIT_OK
