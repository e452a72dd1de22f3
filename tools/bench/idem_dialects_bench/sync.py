"""The sync store benchmark: debit slices on worker threads, exactly-once checked in the database after
each slice (the modes are described in the package docstring and BENCHMARKS.md).

The measured slices reach the database directly, as an application on the same host would: their throughput,
latency and client CPU carry no proxy. Then every mode runs once more through the counting proxy (`wire`), which
counts the round trips each request makes on the wire and, given `added_latency_ms`, adds that much to each: the
throughput of the same requests as if the database were that far away, beside the loopback figures."""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import statistics
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL

from idem_dialects.cli.output import Log
from idem_dialects.dialects.base import Backend
from idem_dialects.engines.entry import provisioning
from idem_dialects.store import IdempotencyStore
from idem_dialects.storebase import connect

from .plan import ACCOUNT_BASE, IDEM_MODES, PLPGSQL_MODES, Config, Slice, Task, plan
from .report import engine_info, new_prefix
from .runner import ExactlyOnceViolation, pool_options, reaching
from .statements import Recorder, StatementLog, record_statements
from .wire import Counts, Window, Wire, no_wire, progress, through_proxy
from .workload import Workload, exactly_once

# Growth per 10k requests under which memory counts as flat: well under 1 byte per request.
FLAT_BYTES_PER_10K = 8 * 1024


def slope_of(points: Sequence[tuple[int, int]]) -> float:
    """Least-squares slope of (requests, bytes); 0 with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return 0.0
    return statistics.linear_regression([float(x) for x, _ in points], [float(y) for _, y in points]).slope


@dataclass
class SliceResult:
    seconds: float
    latencies: list[float]
    outcomes: Counter[str]
    retries: Counter[str]
    cpu_seconds: float = 0.0  # this process's CPU time (all threads) while the slice ran
    wire: Counts | None = None  # what went over the wire meanwhile, when the slice went through the counting proxy


# --- the benchmark -----------------------------------------------------------------------------------------------


@dataclass
class ModeStats:
    throughputs: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    cpu_seconds: float = 0.0
    statements: StatementLog | None = None
    wire: SliceResult | None = None  # the mode's slice through the counting proxy

    def add(self, result: SliceResult) -> None:
        """A measured slice."""
        self.retries.update(result.retries)
        self.outcomes.update(result.outcomes)
        self.throughputs.append(len(result.latencies) / result.seconds)
        self.latencies.extend(result.latencies)
        self.requests += len(result.latencies)
        self.cpu_seconds += result.cpu_seconds


class Bench:
    def __init__(self, store: IdempotencyStore, cfg: Config, log: Callable[[str], None] = lambda s: None) -> None:
        self.store = store
        self.cfg = cfg
        self.log = log
        self.workload = Workload(store)
        self.plpgsql = provisioning(store.backend.name).plpgsql_baseline
        self.no_wire = no_wire(store.engine.url)  # why round trips cannot be counted here, or None
        self.modes = ["bare", *IDEM_MODES, *(PLPGSQL_MODES if self.plpgsql else ())]
        self.stats = {m: ModeStats() for m in self.modes}
        self.first_keys: dict[str, dict[str, list[list[Task]]]] = {}
        self.expected_debits: Counter[int] = Counter()
        self.expected_keys: Counter[int] = Counter()
        self.checks = 0
        self.memory: dict[str, Any] | None = None
        self.profile: str | None = None

    def accounts(self) -> list[int]:
        blocks = sorted(set(ACCOUNT_BASE.values()))
        return [b + w for b in blocks for w in range(self.cfg.workers)]

    @staticmethod
    def request_fn(mode: str, workload: Workload) -> Callable[[int, str], str]:
        if mode == "bare":
            return workload.bare
        if mode in PLPGSQL_MODES:
            return workload.plpgsql
        return workload.via_run

    def execute(self, s: Slice, workload: Workload) -> SliceResult:
        """Send the slice's requests through `workload`, one thread per worker, and time the whole slice."""
        fn = self.request_fn(s.mode, workload)
        lat: list[list[float]] = [[] for _ in s.per_worker]
        outs: list[Counter[str]] = [Counter() for _ in s.per_worker]
        errors: list[BaseException] = []
        before = Counter(workload.store.retries) + Counter(workload.retries)

        def work(w: int) -> None:
            times, out, clock = lat[w], outs[w], time.perf_counter
            try:
                for acct, key in s.per_worker[w]:
                    t0 = clock()
                    out[fn(acct, key)] += 1
                    times.append(clock() - t0)
            except BaseException as exc:
                errors.append(exc)

        cpu = time.process_time()
        if len(s.per_worker) == 1:
            start = time.perf_counter()
            work(0)
            seconds = time.perf_counter() - start
        else:
            gate = threading.Barrier(len(s.per_worker) + 1)

            def gated(w: int) -> None:
                gate.wait()
                work(w)

            threads = [threading.Thread(target=gated, args=(w,), daemon=True) for w in range(len(s.per_worker))]
            for t in threads:
                t.start()
            start = time.perf_counter()
            gate.wait()
            for t in threads:
                t.join()
            seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu
        if errors:
            raise errors[0]
        after = Counter(workload.store.retries) + Counter(workload.retries)
        outcomes: Counter[str] = sum(outs, Counter())
        return SliceResult(seconds, [x for ts in lat for x in ts], outcomes, after - before, cpu)

    def verify(self, s: Slice, result: SliceResult) -> None:
        """Exactly-once: the effect ran once per new key (by outcome), and the database agrees."""
        if s.mode not in ("bare", *PLPGSQL_MODES):
            applied = result.outcomes["applied"]
            if applied != s.expect_applied or applied + result.outcomes["replayed"] != s.size:
                raise ExactlyOnceViolation(
                    f"{s.mode}: {applied} requests ran the effect and {result.outcomes['replayed']} replayed,"
                    f" but {s.expect_applied} distinct new keys were sent in {s.size} requests")
        self.expected_debits.update(s.debits)
        self.expected_keys.update(s.new_keys)
        accounts = sorted({acct for tasks in s.per_worker for acct, _ in tasks})
        self.check_database(s.mode, accounts)

    def check_database(self, mode: str, accounts: Sequence[int]) -> None:
        """In the database: each account debited once per distinct key sent to it, with as many records, all
        complete (the bare effect has no records)."""
        self.checks += 1
        plpgsql = mode in PLPGSQL_MODES
        debits = {a: self.expected_debits[a] for a in accounts}
        exactly_once(f"{mode}: debits per account", self.workload.debits(accounts, plpgsql), debits)
        if mode == "bare":
            return
        keys = {a: self.expected_keys[a] for a in accounts}
        total, done = self.workload.records(accounts, plpgsql)
        exactly_once(f"{mode}: idempotency records per account", total, keys)
        exactly_once(f"{mode}: completed records per account", done, keys)

    def run_slice(self, mode: str, tag: str, cfg: Config | None = None, workload: Workload | None = None,
                  wire: Wire | None = None) -> SliceResult | None:
        """One slice of `mode` (through `workload`, by default the measured store's), checked in the database after;
        with `wire`, what went over it while the requests ran. None for an empty slice."""
        s = plan(mode, tag, cfg or self.cfg, self.first_keys)
        if not s.size:
            return None
        with wire.window() if wire is not None else nullcontext(Window()) as window:
            result = self.execute(s, workload or self.workload)
        if wire is not None:
            result.wire = window.counts
        self.verify(s, result)
        return result

    def run(self) -> None:
        self.workload.create(self.accounts(), self.plpgsql)
        try:
            if self.cfg.warmup:
                for mode in self.modes:
                    self.run_slice(mode, "warmup")
            for rep in range(self.cfg.repetitions):
                for mode in self.modes:
                    if (result := self.run_slice(mode, str(rep))) is not None:
                        self.stats[mode].add(result)
                self.log(f"repetition {rep + 1}/{self.cfg.repetitions}: "
                         + ", ".join(f"{m} {self.stats[m].throughputs[-1]:,.0f}/s" for m in self.modes))
            self.count_statements()
            self.on_the_wire()
            if self.cfg.profile:
                self.profile = self.run_profile(self.cfg.profile)
            if self.cfg.memory_check:
                self.memory = self.memory_check(self.cfg.memory_check)
        finally:
            self.workload.drop()

    def count_statements(self) -> None:
        """One more request per mode, sequential, with every statement and commit logged: through a twin of the
        measured store (same engine and tables) whose statement_hook feeds the log, so that the measured requests
        carry no hook."""
        recorder = Recorder()
        twin = IdempotencyStore(self.store.engine, table_prefix=self.store.table_prefix, statement_hook=recorder)
        with twin.transaction():
            pass  # a store's first transaction reads the server's settings: not a request's cost
        workload = self.workload.on(twin)
        for mode in self.modes:
            s = plan(mode, "count", Config(workers=1, requests=1, duplicates=0.0), self.first_keys)
            ((acct, key),) = s.per_worker[0]
            with record_statements(self.store.engine, recorder) as log:
                self.request_fn(mode, workload)(acct, key)
            self.stats[mode].statements = log
            if mode not in ("replay", "plpgsql_replay"):  # every request that debits, for later checks
                self.expected_debits[acct] += 1
                self.expected_keys[acct] += mode != "bare"

    def on_the_wire(self) -> None:
        """Each mode once more, a slice of `requests` at the same workers, through a store of its own on the counting
        proxy, which adds `added_latency_ms` to each round trip: the round trips per request on the wire, and with
        latency added the throughput at that distance. Its store is warmed first as the measured one was (`warmup`
        requests per mode, at least one per worker), so what is counted is a steady state: no connection opened, no
        handshake, no statement a driver prepares once per connection (psycopg at its fifth execution). Nothing where
        there is no wire."""
        if self.no_wire is not None:
            return
        cfg = self.cfg
        warm = Config(workers=cfg.workers, requests=max(cfg.warmup, cfg.workers), duplicates=cfg.duplicates)
        with through_proxy(self.store.engine.url, cfg.added_latency_ms) as wire:
            url = wire.reach(self.store.engine.url)
            with IdempotencyStore.from_url(url, table_prefix=self.store.table_prefix,
                                           **pool_options(url, max(5, cfg.workers + 1), 2)) as store:
                workload = self.workload.on(store)
                for mode in self.modes:
                    self.run_slice(mode, "wire-warmup", warm, workload)
                for mode in self.modes:
                    self.stats[mode].wire = self.run_slice(mode, "wire", cfg, workload, wire)
        self.log(progress(cfg.added_latency_ms, {m: (r.wire, len(r.latencies)) for m in self.modes
                                                 if (r := self.stats[m].wire) is not None}))

    def run_profile(self, mode: str) -> str:
        """cProfile over one unmeasured slice of `mode` at one worker: where the time goes, top functions."""
        cfg1 = Config(workers=1, requests=self.cfg.requests, duplicates=self.cfg.duplicates)
        if mode in ("replay", "plpgsql_replay"):
            self.run_slice("first" if mode == "replay" else "plpgsql_first", "profile", cfg1)
        s = plan(mode, "profile", cfg1, self.first_keys)
        profiler = cProfile.Profile()
        profiler.enable()
        result = self.execute(s, self.workload)
        profiler.disable()
        self.verify(s, result)
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).strip_dirs()
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(25)
        return out.getvalue()

    def memory_check(self, total: int) -> dict[str, Any]:
        """`total` requests at one worker -- a first-time request, then its replay, in turn -- under tracemalloc."""
        acct, run = ACCOUNT_BASE["memory"], self.workload.via_run
        samples: list[tuple[int, int]] = []
        every = max(1, total // 20)
        gc.collect()
        tracemalloc.start()
        start_current, _ = tracemalloc.get_traced_memory()
        t0 = time.perf_counter()
        outcomes: Counter[str] = Counter()
        for i in range(total):
            outcomes[run(acct, f"m-{i // 2}")] += 1
            if (i + 1) % every == 0:
                gc.collect()
                samples.append((i + 1, tracemalloc.get_traced_memory()[0]))
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        seconds = time.perf_counter() - t0
        distinct = (total + 1) // 2
        self.expected_debits[acct] += distinct
        self.expected_keys[acct] += distinct
        if outcomes["applied"] != distinct or outcomes["replayed"] != total - distinct:
            raise ExactlyOnceViolation(f"memory check: {outcomes['applied']} effects ran and {outcomes['replayed']}"
                                       f" replayed for {distinct} keys in {total} requests")
        self.check_database("memory", [acct])
        # Growth: least-squares slope of traced memory after the first fifth (caches and pools filled by then).
        tail = [(n, b) for n, b in samples if n > total // 5] or samples
        slope = slope_of(tail)
        return {
            "requests": total,
            "pattern": "first-time request, then its replay, alternating; 1 worker",
            "seconds": round(seconds, 3),
            "tracemalloc_start_kib": round(start_current / 1024, 1),
            "tracemalloc_end_kib": round(current / 1024, 1),
            "tracemalloc_peak_kib": round(peak / 1024, 1),
            "growth_per_10k_kib": round(slope * 10_000 / 1024, 3),
            "samples": [[n, round(b / 1024, 1)] for n, b in samples],
            "flat": slope * 10_000 < FLAT_BYTES_PER_10K,
        }

    def report(self, engine_info: dict[str, Any], elapsed: float) -> dict[str, Any]:
        """The JSON report (schema idem-dialects-bench/2, documented in BENCHMARKS.md)."""
        from .sync_report import build_report

        return build_report(self, engine_info, elapsed)


@dataclass(frozen=True)
class SyncBenchmark:
    """`idem-dialects bench --api sync`: IdempotencyStore.run beside the bare effect, on worker threads."""

    cfg: Config

    def refuse(self, backend: type[Backend]) -> str | None:
        profile = self.cfg.profile or ""
        if profile.startswith("plpgsql_") and not provisioning(backend.name).plpgsql_baseline:
            return f"--profile {profile} needs PostgreSQL (the reference debit_once is written in PL/pgSQL)"
        return None

    def measure(self, url: URL, log: Log) -> dict[str, Any]:
        with reaching(url):
            store = IdempotencyStore.from_url(url, table_prefix=new_prefix(),
                                              **pool_options(url, max(5, self.cfg.workers + 1), 2))
        try:
            with reaching(url), connect(store.engine, store.backend) as conn:
                info = engine_info(store.engine.url, store.engine.dialect, store.backend.name,
                                   conn.dialect.server_version_info)
            log(f"{info['backend']} {info['server_version']} via {info['driver']}, tables {store.table_prefix}*")
            bench = Bench(store, self.cfg, log)
            started = time.perf_counter()
            bench.run()
            if bench.profile:
                print(f"cProfile on {info['url']}, one slice of {self.cfg.profile} at 1 worker:\n{bench.profile}",
                      file=sys.stderr)
            return bench.report(info, time.perf_counter() - started)
        finally:
            store.engine.dispose()
