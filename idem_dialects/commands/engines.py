"""`idem-dialects engines`: every engine of the catalogue, whether it can be had here, how, or why not."""

from __future__ import annotations

import argparse
import json
import sys

from ..engines import ENGINES, env_var, expand, provision
from . import EXIT_OK, EXIT_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", action="append", metavar="NAME", help="only these engines (repeatable)")
    parser.add_argument("--format", choices=("table", "json"), default="table")


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
    if args.format == "json":
        print(json.dumps({"version": 1, "engines": found}, indent=2, ensure_ascii=False))
        return EXIT_OK
    for name, info in found.items():
        title = ENGINES[name].title
        if info["available"]:
            print(f"{name:<14} available    {title}: {info['how']} ({info['server_version']})")
        else:
            print(f"{name:<14} unavailable  {title}: {info['reason']}")
            print(f"{'':<14} to enable:   {info['hint'] or 'set ' + env_var(name) + '=<SQLAlchemy URL>'}")
    print(f"\nURLs come from IDEM_URL_<NAME> (e.g. {env_var('mssql-2022')}); `idem-dialects matrix` runs the suite"
          " on every available engine.")
    return EXIT_OK
