"""`idem-dialects bench --api http`: requests per second through the ASGI middleware beside the bare endpoint.

Each database gets a real uvicorn server (in a thread of this process; the app in `http_app`, on Starlette or with
``--framework fastapi`` on FastAPI with the `IdemConnection` dependency) and keep-alive HTTP/1.1 connections. Two
workloads:

- **throughput**: a debit endpoint (the workload's `UPDATE account SET balance = balance - amount`), bare (its own
  transaction),
  then through the middleware in atomic mode (the debit in the record's transaction) with first-time keys, then the
  same keys again (replays); the three in turn, `repetitions` times (fresh keys each time), so drift hits them alike.
  Per path: requests/s, latency percentiles (of every repetition's requests), the server's CPU per request (the
  process's CPU less the client's thread: uvicorn's event loop and any driver threads) and round trips per request,
  each beside the bare endpoint's; the ratios are the median of each repetition's paired ratio. Statements and round
  trips are counted in an unmeasured pass afterwards, through a second store object with a `statement_hook` that
  reaches the database through the counting proxy (`wire`: round trips on the wire), so the measured path carries no
  counting.
  The garbage collector, per path: its collections by generation during the measured requests (per 1,000 requests;
  a full one pauses every request in flight, the p99's tail) and, in another unmeasured pass with the collector
  stopped, what the requests left it: objects only a collection frees (reference cycles) and memory blocks left
  allocated, per request. The app's lifespan freezes the startup heap (`gc.freeze()`, docs/http.md's advice to
  services; ``--no-gc-freeze`` measures without). These are the process's: the client's share is in the bare
  endpoint's figures too (the counting proxy runs in a process of its own: none of it is).
  After the run, the balance must have moved by exactly one debit per distinct key and there must be one record per
  key, or the run fails.
- **latency hiding**: 20 concurrent requests with distinct keys to a handler that waits 200 ms (an external call), in
  external-call mode (leased claim, no transaction held during the call) and bare; the wall time of the 20 is
  compared with the handler's 200 ms.

Needs uvicorn and Starlette (this distribution's dependencies) and an async driver for the engine (the [async]
extra); FastAPI's, the [fastapi] extra.
"""

from __future__ import annotations

import asyncio
import gc
import random
import secrets
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL

from idem_dialects.aio import AsyncIdempotencyStore
from idem_dialects.cli.output import Log
from idem_dialects.dialects.base import Backend

from .accounts import Accounts
from .aio import async_url
from .http_app import ACCOUNT, HANDLER_SECONDS, SCOPE, HttpConnection, build_starlette, uvicorn_server
from .report import engine_info, machine_info, percentiles
from .runner import BenchFailed, backend_of, pool_options, reaching
from .statements import Recorder, record_statements
from .targets import check
from .wire import Window, Wire, about, figures, no_wire, through_proxy
from .workload import exactly_once, records

SCHEMA = "idem-dialects-bench-http/4"  # /4: round trips counted on the wire (`wire`), the garbage collector per path
CONCURRENT_CALLS = 20  # the latency workload: this many requests at once, each waiting HANDLER_SECONDS
WARM = 20  # unmeasured requests per route before the first repetition (pools, caches, the stores' first reads)
COUNTED = 40  # requests per path of the unmeasured pass that counts round trips, sent twice: the second is counted
# Requests per path of the unmeasured pass with the collector stopped (fixed costs amortized), at most: a run of fewer
# --requests sends as many (a smoke run's pass checks the plumbing, not the figures).
GARBAGE = 200
PATHS = (("bare", "/bare/debit"), ("middleware first-time", "/idem/debit"), ("middleware replay", "/idem/debit"))
GENERATIONS = ("gen0", "gen1", "gen2")  # the collector's; a generation 2 collection is a full one


FRAMEWORKS = ("starlette", "fastapi")


def build_app(framework: str, store: AsyncIdempotencyStore, counting: AsyncIdempotencyStore,
              accounts: Accounts, freeze: bool) -> Any:
    """The bench's app (`http_app`'s docstring) on `framework`, its startup heap frozen with `freeze`; FastAPI's
    module is imported only for it."""
    if framework == "fastapi":
        from .http_fastapi import build_fastapi

        return build_fastapi(store, counting, accounts, freeze)
    return build_starlette(store, counting, accounts, freeze)


class RequestsFailed(BenchFailed):
    """A request that should have succeeded (201) did not: the run cannot vouch for exactly-once."""


@dataclass(frozen=True)
class Driven:
    """One path driven: its wall time, each request's latency, the server's CPU seconds meanwhile, and the process's
    garbage collections meanwhile (by generation; and the full ones' seconds: a full collection pauses every request
    in flight)."""

    seconds: float
    latencies: list[float]
    server_cpu: float
    collections: tuple[int, int, int] = (0, 0, 0)
    full_collection_seconds: float = 0.0


class Collections:
    """The process's garbage collections by generation while it is installed (`gc.callbacks`), and the seconds the
    full (generation 2) ones took."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.full_seconds, self._started = 0.0, 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        generation = info["generation"]
        if phase == "start":
            if generation == 2:
                self._started = time.perf_counter()
            return
        self.counts[generation] += 1
        if generation == 2:
            self.full_seconds += time.perf_counter() - self._started


@dataclass
class Left:
    """What requests left the garbage collector (`collector_stopped`): the memory blocks still allocated before it
    ran (what reference counting did not free: reference cycles, and what the process keeps, such as caches and
    pools), and the objects it then found, by type (only it could free them)."""

    blocks: int = 0
    cyclic: Counter[str] = field(default_factory=Counter)


@contextmanager
def collector_stopped() -> Iterator[Left]:
    """The collector stopped, and told to keep what it finds (`gc.DEBUG_SAVEALL`), around the block; the `Left` it
    yields is filled in on the way out. Both collections are of the youngest generation only, where everything the
    block makes stays while the collector is stopped: each costs what the block made, not the whole heap (seconds in a
    test process that has run hundreds of tests). A cycle is counted if its objects are the block's own, as every
    object of a cycle that each request makes again is."""
    left = Left()
    gc.collect(0)  # what went before: freed now, its survivors out of the generation counted
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        blocks = sys.getallocatedblocks()
        yield left
        left.blocks = sys.getallocatedblocks() - blocks
        gc.collect(0)
        left.cyclic.update(type(o).__qualname__ for o in gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        if enabled:
            gc.enable()


async def drive(connections: list[HttpConnection], path: str, keys: list[str]) -> Driven:
    """Send one request per key, one in flight per connection (exit on any non-201). The server's CPU is the process's
    less this thread's: the client runs on this thread's event loop, the server on uvicorn's thread (and the driver's
    threads, where it has some)."""
    queue = list(reversed(keys))
    failures: list[str] = []
    latencies: list[float] = []

    async def worker(conn: HttpConnection) -> None:
        while queue:
            key = queue.pop()
            sent = time.perf_counter()
            status, body = await conn.post(path, key, b'{"amount": 1}')
            latencies.append(time.perf_counter() - sent)
            if status != 201:
                failures.append(f"{status} {body[:200]!r}")

    collections = Collections()
    gc.callbacks.append(collections)
    try:
        cpu, client, started = time.process_time(), time.thread_time(), time.perf_counter()
        await asyncio.gather(*(worker(conn) for conn in connections))
        elapsed = time.perf_counter() - started
        server_cpu = (time.process_time() - cpu) - (time.thread_time() - client)
    finally:
        gc.callbacks.remove(collections)
    if failures:
        raise RequestsFailed(f"{path}: {len(failures)} requests failed, e.g. {failures[0]}")
    gen0, gen1, gen2 = collections.counts
    return Driven(elapsed, latencies, server_cpu, (gen0, gen1, gen2), collections.full_seconds)


@dataclass(frozen=True)
class HttpBenchmark:
    """The ASGI middleware on a real server, beside the bare endpoint (module docstring)."""

    requests: int = 400
    concurrency: int = 8
    repetitions: int = 3
    driver: str | None = None
    framework: str = "starlette"
    gc_freeze: bool = True  # the app's lifespan freezes the startup heap (docs/http.md's advice to services)

    def __post_init__(self) -> None:
        if self.requests < 1 or self.concurrency < 1 or self.repetitions < 1:
            raise ValueError("--requests, --concurrency and --repetitions must be at least 1")
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"--framework must be one of {', '.join(FRAMEWORKS)}, got {self.framework!r}")

    def refuse(self, backend: type[Backend]) -> str | None:
        return None

    @property
    def garbage(self) -> int:
        """Requests per path of the pass with the collector stopped."""
        return min(GARBAGE, self.requests)

    def measure(self, url: URL, log: Log) -> dict[str, Any]:
        return asyncio.run(self._measure(async_url(url, self.driver), log))

    async def _measure(self, url: URL, log: Log) -> dict[str, Any]:
        prefix = f"hb{secrets.token_hex(3)}_"
        accounts = Accounts(prefix)
        # A pool as large as the concurrent requests, so the latency workload measures the layer, not pool waits;
        # where writers take turns on one lock, more connections would only queue for it (the default pool is kept).
        sized = backend_of(url).url_features(url).writers is None
        size = max(CONCURRENT_CALLS, self.concurrency) + 5
        options = pool_options(url, size, 10) if sized else {}
        recorder = Recorder()
        with reaching(url):
            store = AsyncIdempotencyStore.from_url(url, table_prefix=prefix + "idem_", **options)
            await store.create_tables()
        why_no_wire = no_wire(url)
        wire = None if why_no_wire is not None else through_proxy(url)
        counting = AsyncIdempotencyStore.from_url(url if wire is None else wire.reach(url),
                                                  table_prefix=prefix + "idem_", statement_hook=recorder,
                                                  **(pool_options(url, self.concurrency + 2, 10) if sized else {}))
        try:
            async with store.engine.begin() as conn:
                await conn.run_sync(accounts.create, [ACCOUNT])
                info = engine_info(store.engine.url, store.engine.dialect, store.backend.name,
                                   conn.dialect.server_version_info)
            await store.engine.dispose()  # the server's event loop opens its own connections
            log(f"{info['backend']} {info['server_version']} via {info['driver']}, {self.framework}, tables {prefix}*")
            started = time.perf_counter()
            paths, heap = await self._drive(store, counting, recorder, wire, accounts, log)
            async with store.engine.connect() as conn:
                debits = await conn.run_sync(accounts.debits, [ACCOUNT])
                total, _ = await conn.run_sync(records, store.tables, [SCOPE])
            # Debits: the warm-up's on four debit routes, the bare ones, one per first-time key (replays debit
            # nothing), the counting pass's bare and first-time ones (twice), the garbage pass's. Records: warm-up on
            # three routes, one per key, the counting pass's keys (twice), the garbage pass's, the latency workload's.
            measured = self.repetitions * self.requests
            expected = 4 * WARM + 2 * measured + 4 * COUNTED + 2 * self.garbage
            expected_records = 3 * WARM + measured + 2 * COUNTED + self.garbage + CONCURRENT_CALLS
            exactly_once("debits", debits, {ACCOUNT: expected})
            exactly_once("records", total, {SCOPE: expected_records})
        finally:
            await counting.close()
            if wire is not None:
                wire.close()
            await store.drop_tables()
            async with store.engine.begin() as conn:
                await conn.run_sync(accounts.drop)
            await store.engine.dispose()
        once = {"verified": True, "effects": expected, "records": expected_records}
        return self.report(info, paths, heap, once, why_no_wire, time.perf_counter() - started)

    async def _drive(self, store: AsyncIdempotencyStore, counting: AsyncIdempotencyStore, recorder: Recorder,
                     wire: Wire | None, accounts: Accounts, log: Log) -> tuple[list[dict[str, Any]], dict[str, int]]:
        runs: dict[str, list[Driven]] = {title: [] for title, _ in PATHS}
        latency: list[tuple[str, Driven]] = []
        with uvicorn_server(build_app(self.framework, store, counting, accounts, self.gc_freeze)) as base:
            port = int(base.rsplit(":", 1)[1])
            conns = [await HttpConnection.open(port) for _ in range(max(self.concurrency, CONCURRENT_CALLS))]
            few, many = conns[:self.concurrency], conns[:CONCURRENT_CALLS]
            try:
                for path in ("/bare/debit", "/idem/debit", "/count/bare", "/count/debit", "/bare/slow", "/ext/slow"):
                    await drive(many, path, [f"warm{path}{i}" for i in range(WARM)])  # pools, caches, first reads
                # What a full collection scans once the server is warm; the frozen part (the app's lifespan froze
                # it, docs/http.md's advice) is left out.
                gc.collect()
                heap = {"tracked_objects": len(gc.get_objects()), "frozen_objects": gc.get_freeze_count()}
                for rep in range(self.repetitions):
                    keys = [f"k{rep}-{i}" for i in range(self.requests)]
                    sent = {"bare": [f"b{rep}-{i}" for i in range(self.requests)], "middleware first-time": keys,
                            "middleware replay": random.Random(rep).sample(keys, len(keys))}  # again, another order
                    for title, http_path in PATHS:
                        runs[title].append(done := await drive(few, http_path, sent[title]))
                        log(f"throughput {title} ({rep + 1}/{self.repetitions}): {len(sent[title])} requests in"
                            f" {done.seconds:.3f} s")
                trips = await self._count(few, counting, recorder, wire)
                garbage = await self._garbage(few)
                for title, path in (("bare", "/bare/slow"), ("middleware (external call)", "/ext/slow")):
                    latency.append((title, await drive(many, path, [f"{path}{i}" for i in range(CONCURRENT_CALLS)])))
            finally:
                for http in conns:
                    http.close()
        return self.rows(runs, trips, garbage, latency), heap

    async def _count(self, conns: list[HttpConnection], counting: AsyncIdempotencyStore, recorder: Recorder,
                     wire: Wire | None) -> dict[str, dict[str, Any]]:
        """Statements and round trips per request of each path, in an unmeasured pass (module docstring): each path's
        requests sent twice, with other keys, and the second time counted, so that what a driver does once per
        connection (psycopg prepares a statement at its fifth execution) is behind it."""
        found: dict[str, dict[str, Any]] = {}
        for tag in ("w", "c"):
            keys = [f"{tag}{i}" for i in range(COUNTED)]
            for title, path, sent in (("bare", "/count/bare", [f"b{k}" for k in keys]),
                                      ("middleware first-time", "/count/debit", keys),
                                      ("middleware replay", "/count/debit", keys)):
                found[title] = await self._count_path(conns, path, sent, counting, recorder, wire)
        return found

    @staticmethod
    async def _count_path(conns: list[HttpConnection], path: str, sent: list[str], counting: AsyncIdempotencyStore,
                          recorder: Recorder, wire: Wire | None) -> dict[str, Any]:
        window = wire.window() if wire is not None else nullcontext(Window())
        with record_statements(counting.engine.sync_engine, recorder) as log, window as counted:
            done = await drive(conns, path, sent)
        return {"statements_per_request": round(len(log.statements) / len(sent), 2),
                **figures(counted.counts if wire is not None else None, done.latencies)}

    async def _garbage(self, conns: list[HttpConnection]) -> dict[str, dict[str, float]]:
        """Per path, in an unmeasured pass with the collector stopped: the objects only a collection could free (the
        reference cycles requests make) and the memory blocks reference counting left allocated, per request. The
        client shares the process: the bare endpoint's figures hold its share (and uvicorn's, and Starlette's)."""
        keys = [f"g{i}" for i in range(self.garbage)]
        found: dict[str, dict[str, float]] = {}
        for title, path, sent in (("bare", "/bare/debit", [f"b{k}" for k in keys]),
                                  ("middleware first-time", "/idem/debit", keys),
                                  ("middleware replay", "/idem/debit", keys)):
            with collector_stopped() as left:
                await drive(conns, path, sent)
            found[title] = {"cyclic_objects_per_request": round(left.cyclic.total() / len(sent), 2),
                            "blocks_left_per_request": round(left.blocks / len(sent), 1)}
        return found

    def rows(self, runs: dict[str, list[Driven]], trips: dict[str, dict[str, Any]],
             garbage: dict[str, dict[str, float]], latency: list[tuple[str, Driven]]) -> list[dict[str, Any]]:
        bare = runs["bare"]
        paths: list[dict[str, Any]] = []
        for title, done in runs.items():
            n = sum(len(d.latencies) for d in done)
            collected = [sum(d.collections[g] for d in done) for g in range(3)]
            row: dict[str, Any] = {"workload": "throughput", "path": title, "requests": n, "repetitions": len(done),
                   "seconds": round(sum(d.seconds for d in done), 4),
                   "throughput_per_s": round(n / sum(d.seconds for d in done), 1),
                   "latency_ms": percentiles([x for d in done for x in d.latencies]),
                   "server_cpu_us_per_request": round(sum(d.server_cpu for d in done) / n * 1e6, 1),
                   **trips[title], **garbage[title], "x_handler": None,
                   "collections": dict(zip(GENERATIONS, collected, strict=True)),
                   "collections_per_1000": {g: round(c * 1000 / n, 2) for g, c in zip(GENERATIONS, collected,
                                                                                        strict=True)},
                   "full_collections_ms": round(sum(d.full_collection_seconds for d in done) * 1000, 1)}
            if title != "bare":  # each repetition against the bare endpoint's of the same repetition
                row["ratio_to_bare"] = paired(done, bare, lambda d: len(d.latencies) / d.seconds)
                row["cpu_ratio_to_bare"] = paired(done, bare, lambda d: d.server_cpu / len(d.latencies))
                row["cpu_ratios"] = [round(d.server_cpu / b.server_cpu * len(b.latencies) / len(d.latencies), 3)
                                     for d, b in zip(done, bare, strict=True)]
            paths.append(row)
        for title, one in latency:
            paths.append({"workload": "latency", "path": title, "requests": len(one.latencies),
                          "seconds": round(one.seconds, 4),
                          "throughput_per_s": round(len(one.latencies) / one.seconds, 1),
                          "latency_ms": percentiles(one.latencies),
                          "server_cpu_us_per_request": round(one.server_cpu / len(one.latencies) * 1e6, 1),
                          "x_handler": round(one.seconds / HANDLER_SECONDS, 2)})
        return paths

    def report(self, info: dict[str, Any], paths: list[dict[str, Any]], heap: dict[str, int], once: dict[str, Any],
               why_no_wire: str | None, elapsed: float) -> dict[str, Any]:
        report = {"schema": SCHEMA, "engine": info, "machine": machine_info(), "elapsed_s": round(elapsed, 2),
                  "config": {"requests": self.requests, "concurrency": self.concurrency,
                             "repetitions": self.repetitions, "framework": self.framework,
                             "gc_freeze": self.gc_freeze,
                             "concurrent_calls": CONCURRENT_CALLS, "handler_ms": round(HANDLER_SECONDS * 1000)},
                  "wire": about(why_no_wire, 0.0), "heap": heap, "paths": paths, "exactly_once": once}
        return report | {"targets": check(report)}


def paired(done: list[Driven], bare: list[Driven], value: Callable[[Driven], float]) -> float:
    """The median over repetitions of a path's `value` against the bare endpoint's in the same repetition."""
    return round(statistics.median(value(d) / value(b) for d, b in zip(done, bare, strict=True)), 3)
