"""Measure what the protocol costs: seed 000's debit workload beside the bare effect, on one or several engines.

The work is in idem_dialects.benchmark; this module parses arguments, provides the databases (all of them before
anything runs, so a missing one stops the run at once), runs them one after another and prints one report.
Exit status (as every subcommand's, idem_dialects.cli.commands): 0 measured (targets are reported, not enforced),
1 exactly-once violated, 2 an engine is unavailable or a database does not answer, 64 bad arguments (usage).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE

if TYPE_CHECKING:
    from ...engines import Server
    from ..bench import Config

MODES = ["bare", "first", "replay", "contention", "plpgsql_first", "plpgsql_replay"]
FORMATS = ("table", "markdown", "json")
EXIT_VIOLATED = EXIT_FAILED  # exactly-once did not hold
# The run's sizes are Config's fields, each an option: its type and default come from Config (stated once there),
# its metavar and help from here.
SIZES = {
    "workers": ("N", "concurrent workers, one thread and one connection each (default %(default)s)"),
    "requests": ("M", "requests per mode per repetition (default %(default)s)"),
    "duplicates": ("RATIO", "share of the contention slice that repeats a key another worker sends at the same"
                            " moment, in [0, 1) (default %(default)s)"),
    "repetitions": ("R", "interleaved repetitions of every mode; the report takes medians (default %(default)s)"),
    "warmup": ("W", "unmeasured requests per mode before the first repetition (default %(default)s)"),
    "memory_check": ("N", "finally run N requests (first-time and replay in turn) under tracemalloc and report"
                          " memory growth per 10k requests (e.g. 100000; default off)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dataclasses import fields

    from ..bench import Config

    parser.add_argument("url", metavar="URL", nargs="?",
                        help="SQLAlchemy URL, or an engine name from `idem-dialects engines` (sqlite, postgresql-18,"
                             " postgresql, mariadb, ...) to provision it the way the conformance suite does")
    parser.add_argument("--engine", action="append", metavar="NAME", default=[],
                        help="engine to measure (repeatable; 'all' = every engine available here; a family such as"
                             " 'mssql' means every mssql-*); several engines run one after another, one table")
    for size in fields(Config):
        if size.name in SIZES:
            metavar, text = SIZES[size.name]
            parser.add_argument(f"--{size.name.replace('_', '-')}", type=type(size.default), default=size.default,
                                metavar=metavar, help=text)
    parser.add_argument("--profile", choices=MODES,
                        help="also run one unmeasured slice of this mode under cProfile and print the top"
                             " functions to stderr (plpgsql_* on PostgreSQL only)")
    parser.add_argument("--format", choices=FORMATS, default="table",
                        help="table for people, markdown, json (schema idem-dialects-bench/1, or -set/1 for several"
                             " engines; see BENCHMARKS.md) for tools")
    parser.add_argument("--output", metavar="FILE", help="write the report (in --format) to FILE instead of stdout")
    parser.add_argument("--html", metavar="FILE", help="also write the self-contained HTML report to FILE")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--api", choices=["sync", "async"], default="sync",
                        help="async: AsyncIdempotencyStore beside the sync store and the bare async effect, with the"
                             " event-loop lag of a 10 ms heartbeat (idem_dialects.cli.bench.aio; one engine; uses"
                             " --concurrency, --requests, --sleep, --driver, --format)")
    parser.add_argument("--concurrency", type=int, default=20, metavar="N", help="--api async: concurrent tasks")
    parser.add_argument("--sleep", type=float, default=0.2, metavar="S",
                        help="--api async: what the sleep figure's effect awaits, in seconds (default 0.2)")
    parser.add_argument("--driver", metavar="NAME", help="--api async: the async driver (default: the first installed)")


class UsageError(Exception):
    """Bad arguments: reported before anything is provisioned or measured."""


class CannotConnect(Exception):
    """A database given by URL cannot be reached or has no backend/driver here."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _targets(args: argparse.Namespace) -> tuple[list[str], bool]:
    """The URLs / engine names to measure, and whether unavailable ones are skipped ('all') or an error."""
    if args.url and args.engine:
        raise UsageError("give either a URL/engine name or --engine, not both")
    if args.url:
        return [args.url], False
    if not args.engine:
        raise UsageError("which database? give a URL, an engine name or --engine NAME (repeatable, or 'all')")
    from ...engines import expand

    try:
        return expand(args.engine), "all" in args.engine
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None


def _backend(target: str) -> str:
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    from ...engines import get

    if "://" in target:
        try:
            return make_url(target).get_backend_name()
        except ArgumentError as exc:
            raise UsageError(f"{target}: {exc}") from None
    try:
        return get(target).backend
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None


def run(args: argparse.Namespace) -> int:
    from ...engines import provision
    from ..bench import Config

    def log(line: str) -> None:
        if not args.quiet:
            print(f"bench: {line}", file=sys.stderr, flush=True)

    try:
        cfg = Config(**{name: getattr(args, name) for name in SIZES}, profile=args.profile)
        targets, lenient = _targets(args)
        backends = {t: _backend(t) for t in targets}
        if args.api == "async" and len(targets) != 1:
            raise UsageError("--api async measures one engine at a time")
        if args.profile and args.profile.startswith("plpgsql_"):
            others = [t for t, b in backends.items() if b != "postgresql"]
            if others:
                raise UsageError(f"--profile {args.profile} needs PostgreSQL (seed 000's debit_once is PL/pgSQL);"
                                 f" not on {', '.join(others)}")
    except (ValueError, UsageError) as exc:
        print(f"idem-dialects bench: {exc}", file=sys.stderr)
        return EXIT_USAGE

    servers: dict[str, Server | None] = {}
    skipped: dict[str, str] = {}
    reports: list[dict[str, Any]] = []
    try:
        for target in targets:
            if "://" in target:
                servers[target] = None
                continue
            status = provision(target, {})  # as the matrix does: provided, and answering a connection
            if status.server is not None:
                servers[target] = status.server
                log(f"{target}: {status.server.how} ({status.server_version})")
                continue
            if not lenient:
                print(f"idem-dialects bench: {target} is unavailable: {status.reason}", file=sys.stderr)
                if status.hint:
                    print(f"  to provide it: {status.hint}", file=sys.stderr)
                return EXIT_UNAVAILABLE
            skipped[target] = str(status.reason)
            log(f"{target}: unavailable, skipped ({status.reason})")
        if not servers:
            print("idem-dialects bench: no engine available here: " + "; ".join(f"{k}: {v}" for k, v in
                                                                               skipped.items()), file=sys.stderr)
            return EXIT_UNAVAILABLE
        if args.api == "async":  # its own bench, report and output (idem_dialects.cli.bench.aio)
            from sqlalchemy import make_url

            from ..bench.aio import run as run_async

            ((target, provided),) = servers.items()
            return run_async(args, make_url(provided.url if provided else target), log)
        for target, provided in servers.items():
            try:
                report, profile = _measure(target, provided.url if provided else target, cfg, log)
            except CannotConnect as exc:
                print(f"idem-dialects bench: {target}: {exc}", file=sys.stderr)
                return EXIT_UNAVAILABLE
            if report is None:
                return EXIT_VIOLATED
            if provided is not None:
                report["engine"]["name"] = target
            reports.append(report)
            if profile:
                print(f"cProfile on {target}, one slice of {cfg.profile} at 1 worker:\n{profile}", file=sys.stderr)
    finally:
        for running in servers.values():
            if running is not None:
                running.stop()
    return _emit(args, reports, skipped)


def _measure(label: str, url: Any, cfg: Config,
             log: Callable[[str], None]) -> tuple[dict[str, Any] | None, str | None]:
    """One engine's run; (None, None) after an exactly-once violation (already reported on stderr)."""
    from sqlalchemy import make_url

    from ...dialects.sqlite import is_memory
    from ...store import IdempotencyStore
    from ..bench import Bench, ExactlyOnceViolation, engine_info, new_prefix

    options: dict[str, Any] = {}
    parsed = make_url(url)
    if not (parsed.get_backend_name() == "sqlite" and is_memory(parsed)):
        # A connection per worker kept in the pool, so no worker pays for reconnecting.
        options = {"pool_size": max(5, cfg.workers + 1), "max_overflow": 2}
    try:
        store = IdempotencyStore.from_url(parsed, table_prefix=new_prefix(), **options)
    except Exception as exc:  # an unknown dialect, a missing driver: the engine cannot be had, say why
        raise CannotConnect(_first_line(exc)) from None
    try:
        try:
            info = engine_info(store)
        except Exception as exc:  # any driver or network error: no traceback, its first line
            raise CannotConnect(f"cannot connect to {parsed.render_as_string()}: {_first_line(exc)}") from None
        log(f"{label}: {info['backend']} {info['server_version']} via {info['driver']}, tables {store.table_prefix}*")
        bench = Bench(store, cfg, lambda line: log(f"{label}: {line}"))
        started = time.perf_counter()
        try:
            bench.run()
        except ExactlyOnceViolation as exc:
            print("\n" + "!" * 78, file=sys.stderr)
            print(f"EXACTLY-ONCE VIOLATED on {info['backend']} ({info['url']}):\n  {exc}", file=sys.stderr)
            print("!" * 78, file=sys.stderr)
            return None, None
        return bench.report(info, time.perf_counter() - started), bench.profile
    finally:
        store.engine.dispose()


def _emit(args: argparse.Namespace, reports: list[dict[str, Any]], skipped: dict[str, str]) -> int:
    from ..bench import combine
    from ..reporting import render, render_html

    report = reports[0] if len(reports) == 1 and not skipped else combine(reports, skipped)
    text = render(report, args.format)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    if args.html:
        Path(args.html).write_text(render_html([report]), encoding="utf-8")
    return EXIT_OK
