"""The benchmark harness of idem-dialects (the idem-dialects-bench distribution; `idem-dialects bench` through the
idem_dialects.commands entry point): what the protocol costs. One debit workload (`workload`: an account table,
debits of one unit), with and without idempotency, side by side, through each API — the sync store, the async store,
the HTTP middleware — and a message consumer beside the same consumer without the inbox, per broker (`consumer`).

One runner (`runner.run`) provides the databases, runs one API's `Benchmark` on each in turn and returns one report;
`benchmark(api, ...)` builds the Benchmark of an API (its module imported only then), `benchmarks` one per
concurrency level asked for (``--workers 1,8,32``). A new API is one module with
a class that has `refuse` and `measure`, and one branch below.

The sync store's modes (each a slice of `requests` requests, interleaved per repetition so drift hits them all alike):

- ``bare``: the effect alone -- one transaction (begun by `store.transaction()`, the store's own transaction start,
  e.g. BEGIN IMMEDIATE on SQLite) running ``UPDATE account SET balance = balance - 1`` and ``SELECT balance``,
  re-run on retryable errors by the store's own bounded retry;
- ``first``: first-time requests through `IdempotencyStore.run` with the same effect;
- ``replay``: the keys `first` just completed, sent again (the effect must not run);
- ``contention``: the workers send overlapping keys (a share `duplicates` of the slice repeats a key another worker
  sends at the same moment);
- ``plpgsql_first`` / ``plpgsql_replay`` (where the backend runs PL/pgSQL): the same debit hand-written as one
  ``debit_once`` function, one statement per request, created in a scratch schema -- the one-statement reference.

Exactly-once is checked in the database with the conformance suite's tally (`workload.exactly_once`; after every
slice for the sync store, at the end for the others): each account debited once per distinct key sent to it, and
(sync store) exactly that many completed records. A mismatch raises `ExactlyOnceViolation`.

Modules: `command` (the subcommand), `runner` (the one runner), `report` (what every report shares), `targets` (the
one list of performance targets), `render` and `html` (the one renderer), `statements` (what a request sends, by
statement), `wire` (round trips counted on the wire, and latency added to them, by a proxy in a process of its own),
`workload` (the one workload, and the exactly-once check); the sync store: `plan` (which requests each worker sends),
`sync` (threads, checks, profile, memory), `sync_report`; the async store: `aio`; the HTTP middleware: `http`;
operations' costs: `purge`, `outbox`, `telemetry`.
"""

from __future__ import annotations

from typing import Any

from .accounts import Accounts
from .plan import IDEM_MODES, MODES, PLPGSQL_MODES, Config, Slice, plan
from .report import SET_SCHEMA, combine, engine_info, machine_info, new_prefix, percentiles
from .runner import (
    BenchFailed,
    Benchmark,
    CannotMeasure,
    ExactlyOnceViolation,
    Unavailable,
    UsageError,
    run,
    to_measure,
)
from .statements import Recorder, StatementLog, record_statements, statement_kind
from .sync import Bench, SyncBenchmark
from .sync_report import SCHEMA
from .targets import TARGETS, Target
from .workload import Workload, exactly_once, plpgsql_ddl

APIS = ("sync", "async", "http", "consumer")
# What a run measures: the debit workload through an API, or an operation's cost on the sync store.
MEASURES = ("workload", "telemetry", "purge", "outbox")
_MEASURE_OPTIONS = {"telemetry": ("requests", "repetitions", "warmup"),
                    "purge": ("rows", "batch_size", "workers", "recent", "purge_mode", "pace"),
                    "outbox": ("rows", "batch_size", "workers")}


LEVELS = ("workers", "concurrency")  # the options that may list several levels (1,8,32), each measured in turn


def benchmarks(api: str, **options: Any) -> list[Benchmark]:
    """One benchmark of `api` per level of its concurrency option (`--workers` or `--concurrency` given as several
    numbers, each a tuple here), in the order given; one benchmark without one."""
    listed = [name for name in LEVELS if isinstance(options.get(name), tuple)]
    if not listed:
        return [benchmark(api, **options)]
    name = listed[0]
    return [benchmark(api, **(options | {name: level})) for level in options[name]]


def benchmark(api: str, **options: Any) -> Benchmark:
    """The benchmark of `api` with its options (ValueError for a bad value). Only the chosen API's module is
    imported: the async one needs greenlet and an async driver, the HTTP one uvicorn and Starlette, the consumer one
    the brokers' clients."""
    if api == "sync":
        return SyncBenchmark(Config(**options))
    if api == "async":
        from .aio import AsyncBenchmark

        return AsyncBenchmark(**options)
    if api == "http":
        from .http import HttpBenchmark

        return HttpBenchmark(**options)
    if api == "consumer":
        from .consumer import ConsumerBenchmark

        return ConsumerBenchmark(**options)
    raise ValueError(f"unknown API {api!r}; known: {', '.join(APIS)}")


def measurement(name: str, api: str, **options: Any) -> Benchmark:
    """The benchmark of an operation's cost (`MEASURES` but the workload) with its options; ValueError (a usage
    error) for an option it does not use or an API other than the sync store."""
    if api != "sync":
        raise ValueError(f"--measure {name} measures the sync store (no --api {api})")
    wrong = [o for o, value in options.items() if value is not None and o not in _MEASURE_OPTIONS[name]]
    if wrong:
        raise ValueError(f"--measure {name} takes no " + ", ".join(f"--{o.replace('_', '-')}" for o in wrong))
    given = {o: value for o, value in options.items() if value is not None}
    if isinstance(given.get("workers"), tuple):
        if len(given["workers"]) != 1:
            raise ValueError(f"--measure {name} takes one --workers level")
        given["workers"] = given["workers"][0]
    if name == "telemetry":
        from .telemetry import TelemetryBenchmark

        return TelemetryBenchmark(**given)
    if name == "outbox":
        from .outbox import OutboxBenchmark

        return OutboxBenchmark(**given)
    from .purge import PurgeBenchmark

    return PurgeBenchmark(**given)


__all__ = [
    "APIS",
    "IDEM_MODES",
    "LEVELS",
    "MEASURES",
    "MODES",
    "PLPGSQL_MODES",
    "SCHEMA",
    "SET_SCHEMA",
    "TARGETS",
    "Accounts",
    "Bench",
    "BenchFailed",
    "Benchmark",
    "CannotMeasure",
    "Config",
    "ExactlyOnceViolation",
    "Recorder",
    "Slice",
    "StatementLog",
    "SyncBenchmark",
    "Target",
    "Unavailable",
    "UsageError",
    "Workload",
    "benchmark",
    "benchmarks",
    "combine",
    "engine_info",
    "exactly_once",
    "machine_info",
    "measurement",
    "new_prefix",
    "percentiles",
    "plan",
    "plpgsql_ddl",
    "record_statements",
    "run",
    "statement_kind",
    "to_measure",
]
