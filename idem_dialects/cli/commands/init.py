"""`idem-dialects init URL`: create the idempotency tables (idempotent), as `store.create_tables()` does."""

from __future__ import annotations

import argparse

from ...store import IdempotencyStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="SQLAlchemy URL of the database, e.g. postgresql+psycopg://app@db/app")
    parser.add_argument("--table-prefix", default="idem_", help="table name prefix (default: idem_)")


def run(args: argparse.Namespace) -> int:
    with IdempotencyStore.from_url(args.url, table_prefix=args.table_prefix) as store:
        store.create_tables()
        names = ", ".join(t.name for t in store.tables.metadata.sorted_tables)
        print(f"{names} ready on {store.engine.url.render_as_string()} ({store.backend.name})")
    return 0
