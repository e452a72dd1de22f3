"""`idem-dialects bench --api async`: what AsyncIdempotencyStore costs, and whether it keeps the event loop free.

Modes, each run by `concurrency` tasks at once on one event loop, a 10 ms heartbeat task beside them recording its
worst delay (the event-loop lag a `/health` probe would see); with `repetitions` above 1 the modes below run in turn
that many times (keys new to each repetition), and the report gives each mode's median throughput and its median
ratio to the bare effect of the same repetition (paired):

- ``bare``: the effect alone on the AsyncEngine (UPDATE an account, SELECT its balance) in one transaction;
- ``first`` / ``replay`` / ``contention``: through `AsyncIdempotencyStore.run` (contention: pairs of tasks send the
  same key at the same moment, so half the requests replay);
- ``sync_first`` / ``sync_replay``: the sync IdempotencyStore, same effect, one thread per task (for comparison);
- the sleep figure: `concurrency` requests whose effect also awaits ``asyncio.sleep(sleep)``, all sent at once —
  with the async store, the sync store called inside the coroutines (what blocks a server), and the sync store
  behind ``asyncio.to_thread``. Wall time is reported against the effect time.

Then the throughput modes run once more through the counting proxy (`wire`), on stores of their own: the round trips
each request makes on the wire and, given `added_latency_ms`, the throughput with that much added to each round trip,
beside the loopback figures (which carry no proxy).

Exactly-once is checked in the database at the end: the debits equal the distinct keys sent through a store.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from idem_dialects.aio import AsyncIdempotencyStore
from idem_dialects.cli.output import Log
from idem_dialects.dialects.base import Backend
from idem_dialects.errors import MissingDriver
from idem_dialects.store import IdempotencyStore
from idem_dialects.storebase import connect
from idem_dialects.url import async_url as url_async_url
from idem_dialects.url import target

from .accounts import OPERATION, REQUEST, Accounts, scope
from .report import engine_info, machine_info, new_prefix, percentiles
from .runner import CannotMeasure, pool_options, reaching
from .statements import Recorder, StatementLog, record_statements
from .targets import check
from .wire import Counts, Window, Wire, about, figures, no_wire, progress, through_proxy
from .workload import exactly_once

# /2: round trips counted on the wire (`wire`, `added_latency`); /1 modelled them from the statements.
SCHEMA = "idem-dialects-bench-async/2"
# Unmeasured requests per task and mode through the counting proxy before it counts: enough for what a driver does
# once per connection (its first statements prepared; psycopg prepares a statement at its fifth execution).
WIRE_WARMUP = 10
BARE_ACCOUNTS = 900  # accounts from here on are the bare effect's; below, one per task and mode
ACCOUNTS = 1000


@dataclass
class ModeResult:
    requests: int
    wall_s: float
    latencies: list[float]
    worst_lag_ms: float
    replayed: int = 0
    cpu_s: float = 0.0
    statements: StatementLog | None = None
    throughputs: list[float] = field(default_factory=list)  # requests/s of each repetition's slice
    wire: Counts | None = None  # what went over the wire, when the slice went through the counting proxy

    def __post_init__(self) -> None:
        if not self.throughputs and self.wall_s:
            self.throughputs.append(self.requests / self.wall_s)

    def add(self, other: ModeResult) -> None:
        """Another repetition's slice of the same mode: totals add up, the worst lag is the worse of the two."""
        self.requests += other.requests
        self.wall_s += other.wall_s
        self.latencies.extend(other.latencies)
        self.worst_lag_ms = max(self.worst_lag_ms, other.worst_lag_ms)
        self.replayed += other.replayed
        self.cpu_s += other.cpu_s
        self.throughputs.extend(other.throughputs)
        if self.statements is not None and other.statements is not None:
            self.statements.statements.extend(other.statements.statements)
            self.statements.commits += other.statements.commits

    def as_dict(self) -> dict[str, Any]:
        lat = self.latencies
        n, log = max(1, self.requests), self.statements
        return {"requests": self.requests, "wall_s": round(self.wall_s, 4),
                # This process's CPU (all threads) per request; with concurrent tasks the counts are averages.
                "cpu_ms_per_request": round(self.cpu_s * 1000 / n, 4),
                "statements_per_request": None if log is None else round(len(log.statements) / n, 2),
                # The median over repetitions (one repetition: its slice's requests/s).
                "throughput_per_s": round(statistics.median(self.throughputs), 1) if self.throughputs else None,
                "throughput_per_repetition": [round(t, 1) for t in self.throughputs],
                "latency_ms": {**percentiles(lat), "mean": round(statistics.fmean(lat) * 1000, 3) if lat else 0.0},
                "heartbeat_worst_lag_ms": round(self.worst_lag_ms, 2), "replayed": self.replayed}


class Heartbeat:
    """A task that sleeps 10 ms in a loop and remembers the worst extra delay it saw."""

    def __init__(self, period: float = 0.010) -> None:
        self.period = period
        self.worst = 0.0
        self._since = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._since = loop.time()
            await asyncio.sleep(self.period)
            self.worst = max(self.worst, loop.time() - self._since - self.period)

    async def __aenter__(self) -> Heartbeat:
        self.worst = 0.0
        self._task = asyncio.create_task(self._beat())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        # A beat still waiting when the requests end may be the one the loop starved the longest: count it too.
        self.worst = max(self.worst, asyncio.get_running_loop().time() - self._since - self.period)
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


@dataclass
class AsyncBench:
    store: AsyncIdempotencyStore
    sync_store: IdempotencyStore
    concurrency: int
    requests: int
    sleep: float
    log: Callable[[str], None]
    recorder: Recorder  # the stores' statement_hook
    repetitions: int = 1
    results: dict[str, ModeResult] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)  # each distinct key sent through a store, and its account
    added_latency_ms: float = 0.0
    why_no_wire: str | None = None  # why the database has no wire to count on, or None
    wire: Wire | None = None  # the counting proxy the stores reach the database through, if they do
    wire_results: dict[str, ModeResult] = field(default_factory=dict)  # the throughput modes' pass through it

    def __post_init__(self) -> None:
        self.accounts = Accounts(self.store.table_prefix)

    # --- the effect, async and sync (the workload's debit, then the external call's wait) ----------------------

    async def effect(self, conn: AsyncConnection, acct: int, sleep: float = 0.0) -> Any:
        balance = await self.accounts.apply_async(conn, acct)
        if sleep:
            await asyncio.sleep(sleep)
        return {"balance": balance}

    def sync_effect(self, conn: Connection, acct: int, sleep: float = 0.0) -> Any:
        balance = self.accounts.apply(conn, acct)
        if sleep:
            time.sleep(sleep)
        return {"balance": balance}

    # --- modes -------------------------------------------------------------------------------------------------

    async def setup(self) -> None:
        await self.store.create_tables()
        async with self.store.engine.begin() as conn:
            await conn.run_sync(self.accounts.create, range(1, ACCOUNTS))

    async def teardown(self) -> None:
        async with self.store.engine.begin() as conn:
            await conn.run_sync(self.accounts.drop)
        await self.store.drop_tables()

    async def timed(self, name: str, per_task: int, request: Callable[[int, int], Awaitable[bool]]) -> None:
        """Run `request(task, i)` `per_task` times in each of `concurrency` tasks; it returns True if replayed."""
        latencies: list[float] = []
        replayed = 0

        async def worker(task: int) -> None:
            nonlocal replayed
            for i in range(per_task):
                started = time.perf_counter()
                was_replayed = await request(task, i)  # not `replayed += await ...`: that loses updates
                replayed += was_replayed
                latencies.append(time.perf_counter() - started)

        engine = self.sync_store.engine if name.startswith("sync_") else self.store.engine.sync_engine
        counting = self.wire.window() if self.wire is not None else nullcontext(Window())
        with record_statements(engine, self.recorder) as log, counting as window:
            async with Heartbeat() as beat:
                started, cpu = time.perf_counter(), time.process_time()
                await asyncio.gather(*(worker(t) for t in range(self.concurrency)))
                wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        result = ModeResult(len(latencies), wall, latencies, beat.worst * 1000, replayed, cpu, log,
                            wire=window.counts if self.wire is not None else None)
        if name in self.results:
            self.results[name].add(result)
        else:
            self.results[name] = result
        self.log(f"{name}: {len(latencies)} requests in {wall:.2f}s, worst heartbeat lag {beat.worst * 1000:.1f} ms")

    async def run_key(self, key: str, acct: int, sleep: float = 0.0) -> bool:
        self.sent[key] = acct

        async def effect(conn: AsyncConnection) -> Any:
            return await self.effect(conn, acct, sleep)

        result = await self.store.run(scope=scope(acct), operation=OPERATION, key=key, request=REQUEST, effect=effect)
        return result.replayed

    def sync_run_key(self, key: str, acct: int, sleep: float = 0.0) -> bool:
        self.sent[key] = acct
        result = self.sync_store.run(scope=scope(acct), operation=OPERATION, key=key, request=REQUEST,
                                     effect=lambda conn: self.sync_effect(conn, acct, sleep))
        return result.replayed

    async def bare(self, task: int, i: int) -> bool:
        async with self.store.transaction() as conn:
            await self.effect(conn, BARE_ACCOUNTS + task % 50)
        return False

    async def repetition(self, r: str, per: int, executor: ThreadPoolExecutor) -> None:
        """One slice of each throughput mode; `r` makes the keys new to this repetition. The sync store's requests
        run on `executor`'s threads, one per task."""
        loop = asyncio.get_running_loop()

        def in_thread(key: str, acct: int) -> Awaitable[bool]:
            return loop.run_in_executor(executor, self.sync_run_key, key, acct)

        await self.timed("bare", per, self.bare)
        await self.timed("first", per, lambda t, i: self.run_key(f"f{r}-{t}-{i}", 1 + t))
        await self.timed("replay", per, lambda t, i: self.run_key(f"f{r}-{t}-{i}", 1 + t))
        await self.timed("contention", per, lambda t, i: self.run_key(f"c{r}-{t // 2}-{i}", 200 + t // 2))
        await self.timed("sync_first", per, lambda t, i: in_thread(f"s{r}-{t}-{i}", 100 + t))
        await self.timed("sync_replay", per, lambda t, i: in_thread(f"s{r}-{t}-{i}", 100 + t))

    @property
    def per_task(self) -> int:
        return max(1, self.requests // self.concurrency)

    async def run(self) -> None:
        with ThreadPoolExecutor(max_workers=self.concurrency) as executor:
            for rep in range(self.repetitions):  # every mode in turn, so drift hits them alike
                await self.repetition("" if rep == 0 else str(rep), self.per_task, executor)

            # The figure: `concurrency` requests at once, each effect also waiting `sleep` seconds.
            async def sync_in_loop(t: int, i: int) -> bool:
                return self.sync_run_key(f"L-{t}", 400 + t, self.sleep)  # blocks the loop: what not to do

            await self.timed("sleep_async", 1, lambda t, i: self.run_key(f"S-{t}", 300 + t, self.sleep))
            await self.timed("sleep_sync_in_loop", 1, sync_in_loop)
            await self.timed("sleep_sync_to_thread", 1, lambda t, i: asyncio.to_thread(
                self.sync_run_key, f"T-{t}", 500 + t, self.sleep))

    async def on_the_wire(self, store: AsyncIdempotencyStore, sync_store: IdempotencyStore, wire: Wire) -> None:
        """The throughput modes once more through `store` and `sync_store`, which reach the database through `wire`
        (after WIRE_WARMUP unmeasured requests per task and mode): their results are `wire_results`. Their keys join
        `sent`, for the exactly-once check."""
        twin = AsyncBench(store, sync_store, self.concurrency, self.requests, self.sleep, self.log, self.recorder,
                          sent=self.sent)
        with ThreadPoolExecutor(max_workers=self.concurrency) as executor:
            await twin.repetition("ww", WIRE_WARMUP, executor)
            twin.results.clear()
            twin.wire = wire
            await twin.repetition("w", self.per_task, executor)
        self.wire_results = twin.results

    async def check_exactly_once(self) -> None:
        """Each account debited once per distinct key sent to it through a store (the bare effect's accounts aside)."""
        async with self.store.engine.connect() as conn:
            debits = await conn.run_sync(self.accounts.debits, list(range(1, BARE_ACCOUNTS)))
        exactly_once("debits per account", debits, Counter(self.sent.values()))

    def report(self, info: dict[str, Any], elapsed: float) -> dict[str, Any]:
        modes = {name: r.as_dict() for name, r in self.results.items()}
        for name, m in modes.items():
            w = self.wire_results.get(name)
            m.update(figures(w.wire, w.latencies, w.wall_s, self.added_latency_ms, m["throughput_per_s"]) if w
                     else figures(None))
        bare = modes["bare"]["throughput_per_s"] or 1.0
        bare_reps = self.results["bare"].throughputs
        for name, m in modes.items():
            m["ratio_to_bare"] = round((m["throughput_per_s"] or 0) / bare, 3)
            if not name.startswith("sleep_"):  # the throughput modes: one slice per repetition, beside bare's
                paired = [t / b for t, b in zip(self.results[name].throughputs, bare_reps, strict=True)]
                m["ratio_to_bare_paired"] = round(statistics.median(paired), 3)
        figure = {}
        for name in ("sleep_async", "sleep_sync_in_loop", "sleep_sync_to_thread"):
            r = self.results[name]
            figure[name] = {"wall_s": round(r.wall_s, 3), "x_effect_time": round(r.wall_s / self.sleep, 2),
                            "heartbeat_worst_lag_ms": round(r.worst_lag_ms, 1)}
        report = {"schema": SCHEMA, "engine": info, "machine": machine_info(), "elapsed_s": round(elapsed, 2),
                  "config": {"concurrency": self.concurrency, "requests": self.requests, "sleep_s": self.sleep,
                             "repetitions": self.repetitions, "added_latency_ms": self.added_latency_ms},
                  "wire": about(self.why_no_wire, self.added_latency_ms), "modes": modes, "sleep_figure": figure,
                  "exactly_once": {"distinct_keys": len(self.sent)}}
        return report | {"targets": check(report)}


def async_url(url: URL, driver: str | None) -> URL:
    """The URL of the same database through an async driver (`idem_dialects.url.async_url`); CannotMeasure when
    there is none here."""
    with reaching(url):
        resolved = target(url)
    try:
        return url_async_url(resolved.url, driver)
    except MissingDriver:
        raise CannotMeasure(f"no async driver for {resolved.backend.name} is installed"
                            " (pip install 'idem-dialects[async]')") from None


def sync_url(url: URL) -> URL:
    """The URL of the same database through the backend's default sync driver, if `url` names an asyncio-only one."""
    with reaching(url):
        resolved = target(url)
    backend = resolved.backend
    return backend.resolve_url(url.set(drivername=backend.name)) if resolved.asyncio_only else resolved.url


@dataclass(frozen=True)
class AsyncBenchmark:
    """`idem-dialects bench --api async`: AsyncIdempotencyStore beside the bare async effect and the sync store."""

    concurrency: int = 20
    requests: int = 1000
    sleep: float = 0.2
    driver: str | None = None
    repetitions: int = 1
    added_latency_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.requests < 1 or self.repetitions < 1 or self.sleep <= 0:
            raise ValueError("--concurrency, --requests and --repetitions must be at least 1, --sleep above 0")
        if self.added_latency_ms < 0:
            raise ValueError("--added-latency-ms must be at least 0")

    def refuse(self, backend: type[Backend]) -> str | None:
        return None

    def measure(self, url: URL, log: Log) -> dict[str, Any]:
        n = self.concurrency
        aurl, surl = async_url(url, self.driver), sync_url(url)
        recorder = Recorder()  # the stores' statement_hook, for the statement counts
        with reaching(url):
            sync_store = IdempotencyStore.from_url(surl, table_prefix=new_prefix(), statement_hook=recorder,
                                                   **pool_options(surl, n + 2, n))
        try:
            with reaching(url), connect(sync_store.engine, sync_store.backend) as conn:
                info = engine_info(sync_store.engine.url, sync_store.engine.dialect, sync_store.backend.name,
                                   conn.dialect.server_version_info)
            info.update(sync_driver=info["driver"], driver=aurl.get_driver_name(),
                        url=aurl.render_as_string(hide_password=True))
            return asyncio.run(self._measure(aurl, sync_store, recorder, info, log))
        finally:
            sync_store.close()

    async def _measure(self, url: URL, sync_store: IdempotencyStore, recorder: Recorder, info: dict[str, Any],
                       log: Log) -> dict[str, Any]:
        n = self.concurrency
        async with AsyncIdempotencyStore.from_url(url, table_prefix=sync_store.table_prefix, statement_hook=recorder,
                                                  **pool_options(url, n + 2, n)) as store:
            bench = AsyncBench(store, sync_store, n, self.requests, self.sleep, log, recorder, self.repetitions,
                               added_latency_ms=self.added_latency_ms, why_no_wire=no_wire(url))
            await bench.setup()
            started = time.perf_counter()
            try:
                await bench.run()
                if bench.why_no_wire is None:
                    # The measured stores' pools let go of their connections first: beside the proxy's two pools,
                    # four pools of n + 2 pass a server's connection limit (PostgreSQL's default 100 at 32 tasks).
                    await store.engine.dispose()
                    sync_store.engine.dispose()
                    await self._on_the_wire(bench, url, sync_store)
                await bench.check_exactly_once()
            finally:
                await bench.teardown()
            return bench.report(info, time.perf_counter() - started)

    async def _on_the_wire(self, bench: AsyncBench, url: URL, sync_store: IdempotencyStore) -> None:
        """The throughput modes through the counting proxy, on an async and a sync store of their own (no
        statement_hook: their statements are the measured stores')."""
        n = self.concurrency
        surl = sync_store.engine.url
        with through_proxy(url, self.added_latency_ms) as wire:
            async with AsyncIdempotencyStore.from_url(wire.reach(url), table_prefix=sync_store.table_prefix,
                                                      **pool_options(url, n + 2, n)) as store:
                with IdempotencyStore.from_url(wire.reach(surl), table_prefix=sync_store.table_prefix,
                                               **pool_options(surl, n + 2, n)) as sync_twin:
                    await bench.on_the_wire(store, sync_twin, wire)
        bench.log(progress(self.added_latency_ms, {m: (r.wire, r.requests) for m, r in bench.wire_results.items()}))
