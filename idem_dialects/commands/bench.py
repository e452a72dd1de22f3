"""Measure what the protocol costs on one database: seed 000's debit workload beside the bare effect.

The work is in idem_dialects.benchmark; this module parses arguments, provides the database and prints.
Exit status: 0 measured (targets are reported, not enforced), 1 exactly-once violated, 2 the database is unavailable.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

MODE_TITLES = {
    "bare": "bare effect (no idempotency)",
    "first": "first-time via run",
    "replay": "replay via run",
    "contention": "contention via run",
    "plpgsql_first": "PL/pgSQL debit_once, first",
    "plpgsql_replay": "PL/pgSQL debit_once, replay",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL",
                        help="SQLAlchemy URL, or an engine name from `idem-dialects engines` (sqlite, postgresql-18,"
                             " postgresql, mariadb, ...) to provision it the way the conformance suite does")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="concurrent workers, one thread and one connection each (default 1)")
    parser.add_argument("--requests", type=int, default=1000, metavar="M",
                        help="requests per mode per repetition (default 1000)")
    parser.add_argument("--duplicates", type=float, default=0.5, metavar="RATIO",
                        help="share of the contention slice that repeats a key another worker sends at the same"
                             " moment, in [0, 1) (default 0.5)")
    parser.add_argument("--repetitions", type=int, default=5, metavar="R",
                        help="interleaved repetitions of every mode; the report takes medians (default 5)")
    parser.add_argument("--warmup", type=int, default=100, metavar="W",
                        help="unmeasured requests per mode before the first repetition (default 100)")
    parser.add_argument("--memory-check", type=int, default=0, metavar="N",
                        help="finally run N requests (first-time and replay in turn) under tracemalloc and report"
                             " memory growth per 10k requests (e.g. 100000; default off)")
    parser.add_argument("--profile", choices=["bare", "first", "replay", "contention", "plpgsql_first",
                                              "plpgsql_replay"],
                        help="also run one unmeasured slice of this mode under cProfile and print the top"
                             " functions to stderr")
    parser.add_argument("--format", choices=["table", "json"], default="table",
                        help="table for people, json (schema idem-dialects-bench/1, see BENCHMARKS.md) for tools")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--api", choices=["sync", "async"], default="sync",
                        help="async: AsyncIdempotencyStore beside the sync store and the bare async effect, with the"
                             " event-loop lag of a 10 ms heartbeat (idem_dialects.bench_async; uses --concurrency,"
                             " --requests, --sleep, --driver, --format)")
    parser.add_argument("--concurrency", type=int, default=20, metavar="N", help="--api async: concurrent tasks")
    parser.add_argument("--sleep", type=float, default=0.2, metavar="S",
                        help="--api async: what the sleep figure's effect awaits, in seconds (default 0.2)")
    parser.add_argument("--driver", metavar="NAME", help="--api async: the async driver (default: the first installed)")


def run(args: argparse.Namespace) -> int:
    from importlib import import_module

    from sqlalchemy import make_url

    from ..benchmark import Bench, Config, ExactlyOnceViolation, engine_info, new_prefix
    from ..dialects.sqlite import is_memory
    from ..store import IdempotencyStore

    # idem_dialects.engines is mapped from the top-level engines/ directory, which mypy does not follow.
    engines: Any = import_module("idem_dialects.engines")

    try:
        cfg = Config(workers=args.workers, requests=args.requests, duplicates=args.duplicates,
                     repetitions=args.repetitions, warmup=args.warmup, memory_check=args.memory_check,
                     profile=args.profile)
    except ValueError as exc:
        print(f"idem-dialects bench: {exc}", file=sys.stderr)
        return 2

    def log(line: str) -> None:
        if not args.quiet:
            print(f"bench: {line}", file=sys.stderr, flush=True)

    server = None
    url: Any = args.url
    if "://" not in url:
        try:
            server = engines.get(url).provide()
        except (KeyError, engines.Unavailable) as exc:
            print(f"idem-dialects bench: {url}: {exc}", file=sys.stderr)
            return 2
        url = server.url
        log(f"{server.engine}: {server.how}")
    try:
        if args.api == "async":
            from ..bench_async import run as run_async

            return run_async(args, make_url(url), log)
        options: dict[str, Any] = {}
        parsed = make_url(url)
        if not (parsed.get_backend_name() == "sqlite" and is_memory(parsed)):
            # A connection per worker kept in the pool, so no worker pays for reconnecting.
            options = {"pool_size": max(5, cfg.workers + 1), "max_overflow": 2}
        store = IdempotencyStore.from_url(parsed, table_prefix=new_prefix(), **options)
        try:
            info = engine_info(store)
            log(f"{info['backend']} {info['server_version']} via {info['driver']}, tables {store.table_prefix}*")
            bench = Bench(store, cfg, log)
            started = time.perf_counter()
            try:
                bench.run()
            except ExactlyOnceViolation as exc:
                print("\n" + "!" * 78, file=sys.stderr)
                print(f"EXACTLY-ONCE VIOLATED on {info['backend']} ({info['url']}):\n  {exc}", file=sys.stderr)
                print("!" * 78, file=sys.stderr)
                return 1
            report = bench.report(info, time.perf_counter() - started)
        finally:
            store.engine.dispose()
    finally:
        if server is not None:
            server.stop()
    if bench.profile:
        print(f"cProfile, one slice of {cfg.profile} at 1 worker:\n{bench.profile}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print(render_table(report))
    return 0


def render_table(report: dict[str, Any]) -> str:
    e, c = report["engine"], report["config"]
    lines = [
        f"idem-dialects bench -- {e['backend']} {e['server_version']} ({e['dialect']}+{e['driver']}), {e['url']}",
        f"workers {c['workers']}, {c['requests']} requests per mode x {c['repetitions']} interleaved repetitions"
        f" (+{c['warmup']} warm-up), duplicates {c['duplicates']:.0%} in the contention mode",
        f"bare effect: {report['bare_effect']}",
        "",
        f"{'mode':<30} {'req/s':>9} {'x bare':>7} {'paired':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"
        f" {'stmts':>5}  retries",
    ]
    for mode, m in report["modes"].items():
        lat, st = m["latency_ms"], m["statements"]
        retries = ", ".join(f"{k} {v}" for k, v in m["retries"].items()) or "-"
        stmts = "-" if st is None else f"{st['count']}+{st['commits']}c"
        lines.append(
            f"{MODE_TITLES.get(mode, mode):<30} {m['throughput_per_s']['median']:>9,.0f} {m['ratio_to_bare']:>7.2f}"
            f" {m['ratio_to_bare_paired']:>7.2f} {lat['p50']:>8.3f} {lat['p95']:>8.3f} {lat['p99']:>8.3f}"
            f" {stmts:>5}  {retries}")
    lines.append("")
    lines.append("stmts = SQL statements per request seen by before_cursor_execute + driver COMMITs (c):")
    for mode, m in report["modes"].items():
        if m["statements"] is not None:
            lines.append(f"  {mode:<15} {' '.join(m['statements']['kinds'])}")
    if report["implicit_begin"]:
        lines.append(f"  plus, per transaction: {report['implicit_begin']}")
    contention = report["modes"].get("contention")
    if contention:
        o = contention["outcomes"]
        lines.append(f"contention outcomes: {o.get('applied', 0)} applied, {o.get('replayed', 0)} replayed")
    x = report["exactly_once"]
    lines.append(f"exactly-once: verified in the database after each of {x['checks']} slices"
                 f" ({x['effects']} effects == {x['distinct_keys']} distinct keys)")
    lines.append("")
    lines.append("targets:")
    for t in report["targets"]:
        mark = "met   " if t["met"] else "MISSED"
        value = f"{t['ratio']:.2f}x (>= {t['minimum']}x)" if "ratio" in t else f"{t['growth_per_10k_kib']} KiB/10k"
        lines.append(f"  {mark} {t['target']}: {value}")
    mem = report["memory"]
    lines.append("")
    lines.append(f"memory: peak RSS {mem['peak_rss_mib']} MiB")
    check = mem["check"]
    if check:
        lines.append(f"  {check['requests']} requests ({check['pattern']}) in {check['seconds']} s under tracemalloc:"
                     f" start {check['tracemalloc_start_kib']} KiB, end {check['tracemalloc_end_kib']} KiB,"
                     f" peak {check['tracemalloc_peak_kib']} KiB, growth {check['growth_per_10k_kib']} KiB per 10k"
                     f" requests ({'flat' if check['flat'] else 'GROWING'})")
    lines.append(f"elapsed {report['elapsed_s']} s")
    return "\n".join(lines)
