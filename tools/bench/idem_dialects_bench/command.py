"""Measure what the protocol costs: a debit workload beside the bare effect, through the sync store, the async store
or the HTTP middleware, or a message consumer beside the bare consumer (--api), on one or several databases.

The benchmark harness's subcommand, registered in the idem_dialects.commands entry-point group: the work is in this
package (one runner for every API); this module parses arguments, maps outcomes to exit statuses and writes the
report. Exit status (as every subcommand's, idem_dialects.cli.commands): 0 measured
(targets are reported, not enforced), 1 exactly-once violated (or a request failed), 2 an engine is unavailable or
a database does not answer, 64 bad arguments (usage).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from idem_dialects.cli.commands import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from idem_dialects.cli.output import add_output, add_quiet, write

from . import APIS, LEVELS, MEASURES

MODES = ["bare", "first", "replay", "contention", "plpgsql_first", "plpgsql_replay"]
FORMATS = ("table", "markdown", "json")
# Each option of a run, the APIs that use it (given for another API, it is a usage error), its metavar and help.
# Defaults belong to each API's benchmark (stated once there; the help repeats them).
OPTIONS: dict[str, tuple[tuple[str, ...], type, str, str]] = {
    "workers": (("sync",), int, "N[,N...]", "concurrent workers, one thread and one connection each (default 1);"
                                           " several (1,8,32) measure each in turn"),
    "requests": (("sync", "async", "http"), int, "M", "requests per mode (sync, http: per repetition; default"
                                                      " 1000; http: 400)"),
    "duplicates": (("sync",), float, "RATIO", "share of the contention slice that repeats a key another worker sends"
                                              " at the same moment, in [0, 1) (default 0.5)"),
    "repetitions": (("sync", "async", "consumer", "http"), int, "R", "interleaved repetitions of every mode; the"
                                                                      " report takes medians (default 5; async: 1;"
                                                                      " consumer, http: 3)"),
    "warmup": (("sync",), int, "W", "unmeasured requests per mode before the first repetition (default 100)"),
    "memory_check": (("sync",), int, "N", "finally run N requests (first-time and replay in turn) under tracemalloc"
                                          " and report memory growth per 10k requests (e.g. 100000; default off)"),
    "added_latency_ms": (("sync", "async"), float, "MS", "milliseconds added to each round trip in the pass through"
                                                       " the counting proxy (each mode once more, after the measured"
                                                       " ones, to count its round trips on the wire), whose"
                                                       " throughput is then reported beside the loopback figures"
                                                       " (e.g. 1; default 0: round trips only)"),
    "concurrency": (("async", "http"), int, "N[,N...]", "concurrent tasks (async; default 20) or connections for"
                                                        " the throughput workload (http; default 8); several"
                                                        " (1,8,32) measure each in turn"),
    "sleep": (("async",), float, "S", "what the sleep figure's effect awaits, in seconds (default 0.2)"),
    "driver": (("async", "http"), str, "NAME", "the async driver (default: the first installed the backend"
                                                " declares)"),
    "framework": (("http",), str, "NAME", "the app's framework: starlette (default) or fastapi (pydantic bodies and"
                                          " the IdemConnection dependency; the [fastapi] extra)"),
    "messages": (("consumer",), int, "N", "messages per mode and repetition, each broker (default 2000)"),
    "broker": (("consumer",), str, "NAME", "rabbitmq, nats or redis (repeatable; default: every broker reachable"
                                           " here)"),
}

# Options outside OPTIONS (their own argparse forms), with the APIs that use them.
FLAGS: dict[str, tuple[str, ...]] = {"profile": ("sync",), "gc_freeze": ("http",)}


def levels(value: str) -> tuple[int, ...]:
    """'8' or '1,8,32': the concurrency levels to measure, in the order given."""
    try:
        found = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or numbers separated by commas (1,8,32), got {value!r}"
                                         ) from None
    if len(set(found)) != len(found):
        raise argparse.ArgumentTypeError(f"a level is repeated in {value!r}")
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", nargs="?",
                        help="SQLAlchemy URL, or an engine name from `idem-dialects engines` (sqlite, postgresql-18,"
                             " postgresql, mariadb, ...) to provision it the way the conformance suite does")
    parser.add_argument("--engine", action="append", metavar="NAME", default=[],
                        help="engine to measure (repeatable; 'all' = every engine available here; a family such as"
                             " 'mssql' means every mssql-*); several engines run one after another, one report")
    parser.add_argument("--api", choices=APIS, default="sync",
                        help="what to measure: sync = IdempotencyStore.run beside the bare effect on worker threads"
                             " (default); async = AsyncIdempotencyStore beside the bare async effect and the sync"
                             " store, with the event-loop lag of a 10 ms heartbeat; http = the ASGI middleware on a"
                             " real uvicorn server beside the bare endpoint (an async driver's extra);"
                             " consumer = messages/s of each broker's idempotent consumer beside the same consumer"
                             " without the inbox (the brokers' extras)")
    for name, (apis, kind, metavar, text) in OPTIONS.items():
        scope = "" if apis == APIS else f"--api {'/'.join(apis)}: "
        parser.add_argument(f"--{name.replace('_', '-')}", type=levels if name in LEVELS else kind, metavar=metavar,
                            help=scope + text,
                            action="append" if name == "broker" else "store")
    parser.add_argument("--measure", choices=MEASURES, default="workload",
                        help="workload: the debit workload through --api (default); telemetry: replays with telemetry"
                             " off, with OpenTelemetry's no-op API, with the SDK recording (all, traces or metrics"
                             " only, sampled, a dropped span) and beside OpenTelemetry's SQLAlchemy instrumentation"
                             " (--requests, --repetitions, --warmup); purge: purge's rows/s and the rate and latency"
                             " of first-time claims beside it, over the removal itself and over at least 2 s (--rows,"
                             " --recent, --batch-size, --workers, --purge-mode, --pace); outbox: commands/s of 1"
                             " and 4 relays sharing one outbox (--rows, --batch-size; --workers N for one level);"
                             " each on the sync store, one engine")
    parser.add_argument("--rows", type=int, metavar="N", help="--measure purge: old records to purge (default 100000);"
                                                          " outbox: commands to relay (default 20000)")
    parser.add_argument("--batch-size", type=int, metavar="N",
                        help="--measure purge: rows per purge transaction (default 1000); outbox: commands per relay"
                             " round (default 100)")
    parser.add_argument("--recent", type=int, metavar="N",
                        help="--measure purge: records within retention beside the old ones (default 0)")
    parser.add_argument("--purge-mode", choices=("delete", "delete-default-isolation", "generations"),
                        help="--measure purge: delete (row by row, as shipped; the default), delete-default-isolation"
                             " (row by row at the server's default isolation, as before generations) or generations"
                             " (the old records are the previous generation, dropped whole)")
    parser.add_argument("--pace", type=float, metavar="SHARE",
                        help="--measure purge, delete: the share of its time the purge spends in its batches (above 0,"
                             " at most 1: no pauses; default: the library's, 0.5)")
    parser.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction,
                        help="--api http: the app's lifespan freezes the startup heap (gc.freeze(), as docs/http.md"
                             " advises services; the default), so full collections scan only what the server made"
                             " since; --no-gc-freeze measures the server without it")
    parser.add_argument("--profile", choices=MODES,
                        help="--api sync: also run one unmeasured slice of this mode under cProfile and print the top"
                             " functions to stderr (plpgsql_* on PostgreSQL only)")
    parser.add_argument("--format", choices=FORMATS, default="table",
                        help="table for people, markdown, json (schema idem-dialects-bench/2, -async/2, -http/4,"
                             " -consumer/1, or"
                             " -set/1 for several engines or levels; see BENCHMARKS.md) for tools")
    add_output(parser, "the report (in --format)")
    parser.add_argument("--html", metavar="FILE", help="also write the self-contained HTML report to FILE")
    add_quiet(parser)


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The options given for the chosen API; one given for another API is a usage error."""
    from . import UsageError

    given = {name: getattr(args, name) for name in [*OPTIONS, *FLAGS] if getattr(args, name) is not None}
    uses = {name: apis for name, (apis, *_) in OPTIONS.items()} | FLAGS
    wrong = [name for name in given if args.api not in uses[name]]
    if wrong:
        raise UsageError("; ".join(f"--{n.replace('_', '-')} is for --api {' or '.join(uses[n])}" for n in wrong))
    return given


def run(args: argparse.Namespace) -> int:
    import idem_dialects_bench as bench

    def log(line: str) -> None:
        if not args.quiet:
            print(f"bench: {line}", file=sys.stderr, flush=True)

    prog = "idem-dialects bench"
    try:
        names, lenient = bench.to_measure(args.url, args.engine)
        if args.measure == "workload":
            benches = bench.benchmarks(args.api, **options(args))
        elif len(names) != 1:
            raise bench.UsageError(f"--measure {args.measure} measures one engine at a time")
        else:
            chosen = {o: getattr(args, o) for o in (*OPTIONS, *FLAGS, "rows", "batch_size", "recent", "purge_mode",
                                                                 "pace")}
            benches = [bench.measurement(args.measure, args.api, **chosen)]
        report = bench.run(names, benches, lenient=lenient, log=log)
    except (ValueError, bench.UsageError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except bench.Unavailable as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"  to provide it: {exc.hint}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except bench.CannotMeasure as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except bench.ExactlyOnceViolation as exc:
        print(f"\n{'!' * 78}\nEXACTLY-ONCE VIOLATED on {exc}\n{'!' * 78}", file=sys.stderr)
        return EXIT_FAILED
    except bench.BenchFailed as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return emit(args, report)


def emit(args: argparse.Namespace, report: dict[str, Any]) -> int:
    from idem_dialects.cli.reporting import render as as_json

    from .render import render

    write(as_json(report, "json") if args.format == "json" else render(report, args.format), args.output)
    if args.html:
        from idem_dialects.cli.reporting import render_html

        Path(args.html).write_text(render_html([report]), encoding="utf-8")
    return EXIT_OK
