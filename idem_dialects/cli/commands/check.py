"""`idem-dialects check URL`: the conformance suite against one database you name."""

from __future__ import annotations

import argparse

from ...guard import resolve_url
from ...store import IdempotencyStore
from .matrix import add_output_arguments, run_matrix


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="SQLAlchemy URL of the database, e.g."
                        " postgresql+psycopg://app@db/app (tables are created with unique prefixes and dropped)")
    parser.add_argument("--name", default="target", help="the engine's name in the report (default: target)")
    add_output_arguments(parser)


def run(args: argparse.Namespace) -> int:
    url = resolve_url(args.url)  # as from_url does; a configuration error is reported by the CLI's handler
    # Connect once first, as the store does: a wrong password or an unreachable server is two lines from the CLI's
    # handler (ConnectionConfigError / CannotConnect), before any progress output.
    with IdempotencyStore.from_url(url) as store, store.backend.connect(store.engine):
        pass
    return run_matrix([args.name], urls={args.name: url}, required=[args.name], fmt=args.format,
                      select=args.select, output=args.output, quiet=args.quiet, html=args.html,
                      show_skipped=args.show_skipped)
