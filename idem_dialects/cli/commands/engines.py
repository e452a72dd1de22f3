"""`idem-dialects engines`: the engine catalogue — each engine and how it would be provided here.

Listing starts nothing and connects nowhere: it reads the catalogue (and whether an ``IDEM_URL_<NAME>`` is set).
`--probe` provides each engine as the matrix would (starting an embedded server or a cluster for a moment),
checks that it answers, stops it, and says which are available here, how, or what would enable them.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ...engines import ENGINES, describe, env_var, expand, provision
from ..output import add_output, add_quiet, write
from ..reporting import render
from . import EXIT_OK, EXIT_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", action="append", metavar="NAME", help="only these engines (repeatable)")
    parser.add_argument("--probe", action="store_true",
                        help="provide each engine (starting embedded servers and clusters for a moment), check it"
                             " answers, and say which are available here")
    parser.add_argument("--format", choices=("table", "markdown", "json"), default="table",
                        help="table for people, markdown, or json for tools (default: table)")
    add_output(parser, "the list")
    add_quiet(parser, "accepted as every report command does; engines prints no progress")


def run(args: argparse.Namespace) -> int:
    try:
        names = expand(args.engine or ["all"])
    except KeyError as exc:
        print(f"idem-dialects engines: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    found = {name: probed(name) if args.probe else listed(name) for name in names}
    write(render({"version": 1, "probed": args.probe, "engines": found}, args.format), args.output)
    return EXIT_OK


def probed(name: str) -> dict[str, Any]:
    """Provide the engine, check it answers, stop it at once."""
    status = provision(name, {})
    if status.server is not None:
        status.server.stop()
    return status.as_json()


def listed(name: str) -> dict[str, Any]:
    """What the catalogue says of the engine, without providing it."""
    spec = ENGINES[name]
    var = env_var(name)
    ways = [f"the URL in {var}"] if os.environ.get(var) else []
    return {"title": spec.title, "backend": spec.backend, "env_var": var, "url_from_env": bool(os.environ.get(var)),
            "providers": ways + [describe(p) for p in spec.providers], "hint": spec.how_to_enable()}
