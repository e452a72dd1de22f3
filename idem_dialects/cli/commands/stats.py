"""`idem-dialects stats URL`: what an operator asks of the idempotency tables, for people (table) or tools (JSON).

Records by state (completed, in flight, expired lease), the oldest claim not completed and its age, the records and
messages past retention waiting for purge, and each table's size where the engine reports it. With --fail-on-*
thresholds it is a monitoring check: the report is printed either way, and the exit status says whether a threshold
was exceeded.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

from ..output import add_output, add_quiet, write
from . import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from .purge import duration

if TYPE_CHECKING:
    from ...retention import Stats

EXIT_THRESHOLD = EXIT_FAILED  # a --fail-on-* threshold was exceeded (the report is still printed)
EPILOG = (f"exit status: {EXIT_OK} no threshold exceeded; {EXIT_THRESHOLD} a --fail-on-* threshold was exceeded"
          f" (each one named on stderr); {EXIT_UNAVAILABLE} the database did not answer; {EXIT_USAGE} a wrong command"
          f" line; {EXIT_CONFIG} a configuration error (URL, driver, missing tables, privileges)")


def count(text: str) -> int:
    """A threshold: a whole number, 0 or more (argparse type)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 0 or more")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("url", metavar="URL", help="SQLAlchemy URL of the database")
    parser.add_argument("--table-prefix", default="idem_", help="table name prefix (default: idem_)")
    parser.add_argument("--retention", type=duration, default=None, metavar="DURATION",
                        help="the application's retention window (as given to the store or to purge --older-than;"
                             " e.g. 24h, 7d): records completed longer ago are the purge backlog (default 24h, the"
                             " store's default)")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="table for people, json for tools")
    add_output(parser)
    add_quiet(parser, "accepted as every report command does; stats prints no progress (exceeded thresholds"
                      " still go to stderr)")
    parser.add_argument("--fail-on-stuck", type=count, metavar="N",
                        help=f"exit {EXIT_THRESHOLD} if more than N claims are stuck (never completed, lease over)")
    parser.add_argument("--fail-on-backlog", type=count, metavar="N",
                        help=f"exit {EXIT_THRESHOLD} if more than N records and messages are past retention, waiting"
                             " for purge, or if an estimate of them comes from stale statistics and the backlog it"
                             " may hide could exceed N")
    parser.add_argument("--fail-on-age", type=duration, metavar="DURATION",
                        help=f"exit {EXIT_THRESHOLD} if the oldest claim not completed (in flight or stuck) is older")


def exceeded(stats: Stats, args: argparse.Namespace) -> list[str]:
    """One line per threshold the tables exceed."""
    found = []
    if args.fail_on_stuck is not None and stats.expired > args.fail_on_stuck:
        found.append(f"{stats.expired} stuck claims (never completed, lease over) exceed --fail-on-stuck"
                     f" {args.fail_on_stuck}")
    backlog = stats.purgeable + stats.purgeable_messages
    if args.fail_on_backlog is not None and backlog > args.fail_on_backlog:
        found.append(f"{backlog} rows past retention ({_duration(stats.retention)}) exceed --fail-on-backlog"
                     f" {args.fail_on_backlog}: run purge (see docs/operations/purge.md)")
    elif args.fail_on_backlog is not None and backlog_bound(stats) > args.fail_on_backlog:
        # Never silent over a backlog the figure cannot see: stale statistics fail the check, saying how to fix them.
        found.append(f"{backlog} rows past retention is an estimate from stale statistics"
                     f" ({', '.join(stats.stale)}: many rows written since the engine last gathered them); the backlog"
                     f" may be up to {backlog_bound(stats)}, over --fail-on-backlog {args.fail_on_backlog}: refresh the"
                     f" tables' statistics (ANALYZE; on MySQL/MariaDB ANALYZE TABLE) and check again")
    age = stats.oldest_open_age
    if args.fail_on_age is not None and age is not None and age > args.fail_on_age:
        found.append(f"the oldest open claim is {_duration(age)} old, over --fail-on-age {_duration(args.fail_on_age)}")
    return found


def backlog_bound(stats: Stats) -> int:
    """The largest backlog the figures allow: a stale estimate of the rows past retention may be as large as its
    table (so a small table never fails the check for being stale)."""
    return ((stats.records if "purgeable" in stats.stale else stats.purgeable)
            + (stats.messages if "purgeable_messages" in stats.stale else stats.purgeable_messages))


def run(args: argparse.Namespace) -> int:
    from ...retention import DEFAULT_RETENTION
    from ...url import parse
    from ..database import reached

    retention = DEFAULT_RETENTION if args.retention is None else args.retention
    with reached(args.url, existing=True, table_prefix=args.table_prefix, retention=retention) as store:
        stats = store.stats()
        # The URL as given (the engine's may be the backend's open-if-it-exists form of it), never its password.
        where = f"{parse(args.url).render_as_string(hide_password=True)}, tables {store.table_prefix}*"
    if args.format == "json":
        write(json.dumps({"database": where} | stats.as_dict(), indent=2) + "\n", args.output)
    else:
        write(describe(stats, where) + "\n", args.output)
    problems = exceeded(stats, args)
    for line in problems:
        print(f"idem-dialects stats: {line}", file=sys.stderr)
    return EXIT_THRESHOLD if problems else EXIT_OK


def describe(stats: Stats, where: str) -> str:
    oldest = "none"
    if stats.oldest_open is not None and stats.oldest_open_age is not None:
        oldest = f"created {stats.oldest_open:%Y-%m-%d %H:%M:%S} UTC, {_duration(stats.oldest_open_age)} ago"
    def n(name: str, value: int) -> str:  # "~": the engine's estimate, not a count
        figure = f"~{value:,}" if name in stats.estimated else f"{value:,}"
        return f"{figure} (stale)" if name in stats.stale else figure

    rows = [
        ("records", n("records", stats.records)),
        ("  completed", n("completed", stats.completed)),
        ("  in flight", f"{stats.in_flight:,}  (live lease)"),
        ("  expired lease", f"{stats.expired:,}  (stuck: never completed, lease over)"),
        ("oldest open claim", oldest),
        ("retention", _duration(stats.retention)),
        ("past retention", f"{n('purgeable', stats.purgeable)} records,"
                           f" {n('purgeable_messages', stats.purgeable_messages)} messages  (waiting for purge)"),
        ("messages", n("messages", stats.messages)),
    ]
    if stats.estimated:
        rows.append(("", "~ the engine's estimate (catalog statistics), not a count"))
    if stats.stale:
        rows.append(("", "(stale) from statistics many writes old, maybe far off: ANALYZE the table for a right one"))
    for name, size in stats.sizes.items():
        rows.append((f"size {name}", "not reported" if size is None else
                     f"{_bytes(size.table_bytes)} table, {_bytes(size.index_bytes)} indexes"))
    if stats.sizes_unavailable:
        rows.append(("size", f"not reported: {stats.sizes_unavailable}"))
    width = max(len(name) for name, _ in rows)
    return "\n".join([where, *(f"{name:<{width}}  {value}" for name, value in rows)])


def _bytes(n: int) -> str:
    size, unit = float(n), "B"
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            break
        size /= 1024
    return f"{size:,.0f} B" if unit == "B" else f"{size:,.1f} {unit}"


def _duration(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds < 10:
        return f"{span.total_seconds():.1f}s"
    parts = [(seconds // 86400, "d"), (seconds % 86400 // 3600, "h"), (seconds % 3600 // 60, "m"), (seconds % 60, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n)
