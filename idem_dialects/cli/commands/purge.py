"""`idem-dialects purge URL --older-than 24h --batch-size 1000`: retention from the command line, with progress."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

from ...limits import DEFAULT_PACE, parse_duration
from ..database import reached
from ..output import add_quiet


def duration(text: str) -> timedelta:
    """'24h', '90m', '7d', '1h30m' -> timedelta (argparse type)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def share(text: str) -> float:
    """'0.5' -> 0.5, above 0 and at most 1 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number above 0 and at most 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="SQLAlchemy URL of the database")
    parser.add_argument("--older-than", type=duration, required=True, metavar="DURATION",
                        help="delete records completed longer ago than this (e.g. 24h, 7d; at most 100 years)")
    parser.add_argument("--batch-size", type=int, default=1000, metavar="N",
                        help="rows per transaction (default 1000, at most 1,000,000)")
    parser.add_argument("--pace", type=share, default=DEFAULT_PACE, metavar="SHARE",
                        help=f"the share of its time purge spends deleting, pausing between batches so that traffic"
                             f" keeps the rest of the database (above 0, at most 1: no pauses; default {DEFAULT_PACE};"
                             f" a batch slower than 0.1 s also makes the next one smaller)")
    parser.add_argument("--table-prefix", default="idem_", help="table name prefix (default: idem_)")
    parser.add_argument("-v", "--verbose", action="store_true", help="a progress line per batch on stderr")
    add_quiet(parser, "no summary line on success (for cron); errors still go to stderr")


def run(args: argparse.Namespace) -> int:
    done: dict[str, int] = {}

    def progress(table: str, deleted: int) -> None:
        done[table] = done.get(table, 0) + deleted
        if args.verbose:
            print(f"  {table}: {done[table]} deleted", file=sys.stderr, flush=True)

    with reached(args.url, existing=True, table_prefix=args.table_prefix) as store:
        total = store.purge(older_than=args.older_than, batch_size=args.batch_size, progress=progress,
                            pace=args.pace)
    if not args.quiet:
        print(f"purged {total} rows older than {args.older_than}"
              f" ({', '.join(f'{t}: {n}' for t, n in done.items())})")
    return 0
