"""`idem-dialects check URL`: the conformance suite against one database you name."""

from __future__ import annotations

import argparse
import os
from contextlib import suppress

from ...engines import provisioning
from ...url import target
from .matrix import add_output_arguments, reach, require_suite, run_matrix


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="SQLAlchemy URL of the database, e.g."
                        " postgresql+psycopg://app@db/app (tables are created with unique prefixes and dropped)")
    parser.add_argument("--name", default="target", help="the engine's name in the report (default: target)")
    parser.add_argument("--keep-database", action="store_true",
                        help="keep a database file the check created (SQLite: by default the run removes the file it"
                             " made, and leaves one that was there before as it found it)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    require_suite("check")
    resolved = target(args.url)
    made = [f for f in provisioning(resolved.backend.name).database_files(resolved.url) if not os.path.exists(f)]
    try:
        # Connect once first, as the store does: a bad URL, a missing driver, a wrong password, an unreachable server
        # or a role that may not create tables is at most two lines from the CLI's handler, before any progress
        # output. This connection is also the suite's probe of the URL (the engine's one answer), so the only
        # engines built after it are those the checks build.
        url, version = reach(args.url)
        return run_matrix([args.name], urls={args.name: url}, required=[args.name], fmt=args.format,
                          select=args.select, output=args.output, quiet=args.quiet, html=args.html,
                          show_skipped=args.show_skipped, versions={args.name: version})
    finally:
        for path in made if not args.keep_database else ():
            with suppress(FileNotFoundError):
                os.remove(path)
