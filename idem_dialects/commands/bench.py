"""Measure what the protocol costs: seed 000's debit workload beside the bare effect, on one or several engines.

The work is in idem_dialects.benchmark; this module parses arguments, provides the databases (all of them before
anything runs, so a missing one stops the run at once), runs them one after another and prints one report.
Exit status (as every subcommand's, idem_dialects.commands): 0 measured (targets are reported, not enforced),
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
    from ..benchmark import Config
    from ..engines import Server

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

    from ..benchmark import Config

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
                             " event-loop lag of a 10 ms heartbeat (idem_dialects.bench_async; one engine; uses"
                             " --concurrency, --requests, --sleep, --driver, --format)")
    parser.add_argument("--concurrency", type=int, default=20, metavar="N", help="--api async: concurrent tasks")
    parser.add_argument("--sleep", type=float, default=0.2, metavar="S",
                        help="--api async: what the sleep figure's effect awaits, in seconds (default 0.2)")
    parser.add_argument("--driver", metavar="NAME", help="--api async: the async driver (default: the first installed)")
    parser.add_argument("--measure", choices=["workload", "telemetry", "purge"], default="workload",
                        help="workload: the debit workload beside the bare effect (default); telemetry: replays with"
                             " telemetry off, with OpenTelemetry's no-op API and with the SDK recording (uses"
                             " --requests, --repetitions, --warmup); purge: purge's rows/s and the latency of"
                             " first-time claims beside it (uses --rows, --batch-size, --workers); one engine")
    parser.add_argument("--rows", type=int, default=100_000, metavar="N",
                        help="--measure purge: old records to purge (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=1000, metavar="N",
                        help="--measure purge: rows per purge transaction (default %(default)s)")


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
    from ..engines import expand

    try:
        return expand(args.engine), "all" in args.engine
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None


def _backend(target: str) -> str:
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    from ..engines import get

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
    from ..benchmark import Config
    from ..engines import provision

    def log(line: str) -> None:
        if not args.quiet:
            print(f"bench: {line}", file=sys.stderr, flush=True)

    try:
        cfg = Config(**{name: getattr(args, name) for name in SIZES}, profile=args.profile)
        targets, lenient = _targets(args)
        backends = {t: _backend(t) for t in targets}
        if (args.api == "async" or args.measure != "workload") and len(targets) != 1:
            raise UsageError(f"--api {args.api} --measure {args.measure} measures one engine at a time")
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
        if args.api == "async":  # its own bench, report and output (idem_dialects.bench_async)
            from sqlalchemy import make_url

            from ..bench_async import run as run_async

            ((target, provided),) = servers.items()
            return run_async(args, make_url(provided.url if provided else target), log)
        if args.measure != "workload":
            ((target, provided),) = servers.items()
            return _measure_one(args, provided.url if provided else target, cfg, log)
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

    from ..benchmark import Bench, ExactlyOnceViolation, engine_info, new_prefix
    from ..store import IdempotencyStore

    parsed = make_url(url)
    try:
        store = IdempotencyStore.from_url(parsed, table_prefix=new_prefix(), **_pool(parsed, cfg.workers))
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


def _pool(url: Any, workers: int) -> dict[str, Any]:
    """A connection per worker kept in the pool, so no worker pays for reconnecting (one shared :memory: SQLite
    connection has no pool to size)."""
    from ..dialects.sqlite import is_memory

    if url.get_backend_name() == "sqlite" and is_memory(url):
        return {}
    return {"pool_size": max(5, workers + 2), "max_overflow": 2}


def _measure_one(args: argparse.Namespace, url: Any, cfg: Config, log: Callable[[str], None]) -> int:
    """--measure telemetry or purge on one database: its report as a table or JSON."""
    import json

    from sqlalchemy import make_url

    from ..benchmark import engine_info, new_prefix
    from ..benchmark import purge as purge_bench
    from ..benchmark import telemetry as telemetry_bench
    from ..store import IdempotencyStore

    parsed = make_url(url)
    store = IdempotencyStore.from_url(parsed, table_prefix=new_prefix(), **_pool(parsed, cfg.workers))
    try:
        info = engine_info(store)
        log(f"{info['backend']} {info['server_version']} via {info['driver']}, tables {store.table_prefix}*")
        try:
            if args.measure == "telemetry":
                report = telemetry_bench.measure(store, cfg.requests, cfg.repetitions, cfg.warmup, log)
            else:
                report = purge_bench.measure(store, args.rows, args.batch_size, cfg.workers, log)
        except telemetry_bench.MissingSdk as exc:
            print(f"idem-dialects bench: {exc}", file=sys.stderr)
            return EXIT_USAGE
        report["engine"] = info
        module = telemetry_bench if args.measure == "telemetry" else purge_bench
        text = json.dumps(report, indent=2) + "\n" if args.format == "json" else module.render(report)
        if args.output:
            Path(args.output).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
        return EXIT_OK
    finally:
        store.drop_tables()
        store.engine.dispose()


def _emit(args: argparse.Namespace, reports: list[dict[str, Any]], skipped: dict[str, str]) -> int:
    from ..benchmark import combine
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
