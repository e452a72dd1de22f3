"""`idem-dialects check URL`: the conformance suite against one database you name."""

from __future__ import annotations

import argparse

from .matrix import add_output_arguments, reach, require_suite, run_matrix


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="SQLAlchemy URL of the database, e.g."
                        " postgresql+psycopg://app@db/app (tables are created with unique prefixes and dropped)")
    parser.add_argument("--name", default="target", help="the engine's name in the report (default: target)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    require_suite("check")
    # Connect once first, as the store does: a bad URL, a missing driver, a wrong password, an unreachable server or
    # a role that may not create tables is at most two lines from the CLI's handler, before any progress output.
    # This connection is also the suite's probe of the URL (the engine's one answer), so the only engines built
    # after it are those the checks build.
    url, version = reach(args.url)
    return run_matrix([args.name], urls={args.name: url}, required=[args.name], fmt=args.format,
                      select=args.select, output=args.output, quiet=args.quiet, html=args.html,
                      show_skipped=args.show_skipped, versions={args.name: version})
