"""`idem-dialects init URL`: create the idempotency tables (idempotent), as `store.create_tables()` does."""

from __future__ import annotations

import argparse

from ..database import reached
from ..output import add_quiet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="SQLAlchemy URL of the database, e.g. postgresql+psycopg://app@db/app")
    parser.add_argument("--table-prefix", default="idem_", help="table name prefix (default: idem_)")
    parser.add_argument("--generations", action="store_true",
                        help="also create the previous generation's table: purge then drops a whole generation past"
                             " retention instead of deleting row by row (PostgreSQL, MySQL, MariaDB but Galera; restart"
                             " running applications before the first purge)")
    add_quiet(parser, "print nothing on success; errors still go to stderr")


def run(args: argparse.Namespace) -> int:
    with reached(args.url, table_prefix=args.table_prefix) as store:
        store.create_tables(generations=args.generations)
        made = [*store.tables.metadata.sorted_tables, *([store.tables.previous] if args.generations else [])]
        names = ", ".join(t.name for t in made)
        if not args.quiet:
            print(f"{names} ready on {store.engine.url.render_as_string(hide_password=True)} ({store.backend.name})")
    return 0
