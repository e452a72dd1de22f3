"""`idem-dialects check URL`: the conformance suite against one database you name."""

from __future__ import annotations

import argparse
import sys

from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError

from . import EXIT_USAGE
from .matrix import add_output_arguments, run_matrix


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="SQLAlchemy URL of the database, e.g."
                        " postgresql+psycopg://app@db/app (tables are created with unique prefixes and dropped)")
    parser.add_argument("--name", default="target", help="the engine's name in the report (default: target)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        url = make_url(args.url)
    except ArgumentError as exc:
        print(f"idem-dialects check: not a database URL: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run_matrix([args.name], urls={args.name: url}, required=[args.name], fmt=args.format,
                      select=args.select, output=args.output, quiet=args.quiet, html=args.html,
                      show_skipped=args.show_skipped)
