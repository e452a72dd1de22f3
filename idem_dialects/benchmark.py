"""What the protocol costs on one database: seed 000's debit workload, with and without idempotency, side by side.

Modes (each a slice of `requests` requests, interleaved per repetition so drift hits them all alike):

- ``bare``: the effect alone -- one transaction (begun by `store.transaction()`, the store's own transaction start,
  e.g. BEGIN IMMEDIATE on SQLite) running ``UPDATE account SET balance = balance - 1`` and ``SELECT balance``;
- ``first``: first-time requests through `IdempotencyStore.run` with the same effect;
- ``replay``: the keys `first` just completed, sent again (the effect must not run);
- ``contention``: the workers send overlapping keys (a share `duplicates` of the slice repeats a key another worker
  sends at the same moment);
- ``plpgsql_first`` / ``plpgsql_replay`` (PostgreSQL only): seed 000's hand-written ``debit_once`` function,
  one statement per request, created in a scratch schema -- the one-round-trip reference.

Exactly-once is checked after every slice, in the database: each account's debits equal the distinct keys sent to
it, and each scope holds exactly that many completed records. A mismatch raises `ExactlyOnceViolation`.
The JSON report (`Report.as_dict`) has a stable, versioned schema documented in BENCHMARKS.md.
"""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import resource
import secrets
import statistics
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import BigInteger, Column, Engine, Integer, MetaData, Table, bindparam, event, func, select, text
from sqlalchemy.engine import Connection

from .errors import IdemError
from .store import IdempotencyStore

SCHEMA = "idem-dialects-bench/1"
OPERATION = "debit:v1"
REQUEST = {"amount": 1}
INITIAL_BALANCE = 10**15  # enough for any run; debits are whole units of 1
IDEM_MODES = ("first", "replay", "contention")
PLPGSQL_MODES = ("plpgsql_first", "plpgsql_replay")
# Targets of the issue: (name, numerator mode, denominator mode, minimum ratio).
TARGETS = (
    ("first-time via run >= 0.7x bare", "first", "bare", 0.7),
    ("replay via run >= 1.0x bare", "replay", "bare", 1.0),
    ("first-time via run within 2x of PL/pgSQL debit_once", "first", "plpgsql_first", 0.5),
    ("replay via run within 2x of PL/pgSQL debit_once replay", "replay", "plpgsql_replay", 0.5),
)
# Growth per 10k requests under which memory counts as flat: well under 1 byte per request.
FLAT_BYTES_PER_10K = 8 * 1024
# Account ids: one block per workload, one account per worker (or per key class in `contention`).
_ACCOUNT_BASE = {"bare": 1000, "first": 2000, "replay": 2000, "contention": 3000, "plpgsql_first": 4000,
                 "plpgsql_replay": 4000, "memory": 5000}
MAX_WORKERS = 999


class ExactlyOnceViolation(IdemError):
    """The database shows a different number of effects than distinct keys: the protocol failed."""


@dataclass(frozen=True)
class Config:
    workers: int = 1
    requests: int = 1000
    duplicates: float = 0.5
    repetitions: int = 5
    warmup: int = 100
    memory_check: int = 0
    profile: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1-{MAX_WORKERS}")
        if self.requests < self.workers:
            raise ValueError("requests (per slice) must be at least the number of workers")
        if not 0.0 <= self.duplicates < 1.0:
            raise ValueError("duplicates must be a ratio in [0, 1)")
        if self.repetitions < 1 or self.warmup < 0 or self.memory_check < 0:
            raise ValueError("repetitions must be >= 1; warmup and memory_check >= 0")


# --- counting statements -------------------------------------------------------------------------------------


@dataclass
class StatementLog:
    """SQL the engine sent through cursors (BEGIN IMMEDIATE and SAVEPOINTs included) and driver-level commits."""

    statements: list[str] = field(default_factory=list)
    commits: int = 0
    rollbacks: int = 0

    @property
    def kinds(self) -> list[str]:
        return [statement_kind(s) for s in self.statements]


def statement_kind(sql: str) -> str:
    """The leading keyword(s): INSERT, SELECT, UPDATE, BEGIN IMMEDIATE, SAVEPOINT, RELEASE SAVEPOINT, ..."""
    words = sql.split()
    if not words:
        return ""
    first = words[0].upper()
    second = words[1].upper() if len(words) > 1 else ""
    if first in ("BEGIN", "RELEASE") and second in ("IMMEDIATE", "EXCLUSIVE", "DEFERRED", "SAVEPOINT", "TRANSACTION"):
        return f"{first} {second}"
    if first == "ROLLBACK" and second == "TO":
        return "ROLLBACK TO SAVEPOINT"
    if first == "WITH":
        return "WITH"
    return first


@contextmanager
def record_statements(engine: Engine) -> Iterator[StatementLog]:
    """Log every statement and commit on `engine` while the block runs (sequential code only: it is engine-wide)."""
    log = StatementLog()

    def on_execute(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        log.statements.append(statement)

    def on_commit(conn: Any) -> None:
        log.commits += 1

    def on_rollback(conn: Any) -> None:
        log.rollbacks += 1

    hooks: list[tuple[str, Callable[..., None]]] = [
        ("before_cursor_execute", on_execute), ("commit", on_commit), ("rollback", on_rollback)]
    for name, fn in hooks:
        event.listen(engine, name, fn)
    try:
        yield log
    finally:
        for name, fn in hooks:
            event.remove(engine, name, fn)


def implicit_begin(engine: Engine) -> str | None:
    """The BEGIN a driver sends on its own (not through a cursor SQLAlchemy sees), if it sends one."""
    if engine.dialect.driver in ("psycopg", "psycopg2"):
        return "psycopg sends BEGIN before a transaction's first statement (one more round trip)"
    return None


# --- the workload ----------------------------------------------------------------------------------------------


class Workload:
    """The seed 000 debit workload on one store: an account table, debits of 1, optional PL/pgSQL reference."""

    def __init__(self, store: IdempotencyStore) -> None:
        self.store = store
        self.engine = store.engine
        self.metadata = MetaData()
        self.account = Table(
            f"{store.table_prefix}account",
            self.metadata,
            Column("id", Integer, primary_key=True, autoincrement=False),
            Column("balance", BigInteger, nullable=False),
        )
        a = self.account.c
        self._debit = self.account.update().where(a.id == bindparam("acct")).values(balance=a.balance - 1)
        self._balance = select(a.balance).where(a.id == bindparam("acct"))
        self.pg_schema: str | None = None
        self.retries: Counter[str] = Counter()  # retries of the bare effect (no `run` to count them)
        self._lock = threading.Lock()

    # setup / teardown

    def create(self, accounts: Sequence[int], plpgsql: bool) -> None:
        self.store.create_tables()
        with self.engine.begin() as conn:
            self.metadata.create_all(conn)
            conn.execute(self.account.insert(), [{"id": i, "balance": INITIAL_BALANCE} for i in accounts])
        if plpgsql:
            self.pg_schema = self.store.table_prefix.rstrip("_")
            with self.engine.begin() as conn:
                for statement in plpgsql_ddl(self.pg_schema):
                    conn.exec_driver_sql(statement)
                conn.execute(text(f"INSERT INTO {self.pg_schema}.account VALUES (:id, :balance)"),
                             [{"id": i, "balance": INITIAL_BALANCE} for i in accounts])

    def drop(self) -> None:
        with self.engine.begin() as conn:
            self.metadata.drop_all(conn)
            if self.pg_schema is not None:
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {self.pg_schema} CASCADE")
        self.store.drop_tables()

    # one request of each kind; each returns "applied" or "replayed"

    def debit(self, conn: Connection, acct: int) -> int:
        conn.execute(self._debit, {"acct": acct})
        return int(conn.execute(self._balance, {"acct": acct}).scalar_one())

    def bare(self, acct: int, key: str) -> str:
        while True:
            try:
                with self.store.transaction() as conn:
                    self.debit(conn, acct)
                return "applied"
            except Exception as exc:
                cause = self.store.retry_cause(exc)
                if cause is None:
                    raise
                with self._lock:
                    self.retries[cause] += 1
                time.sleep(0.001)

    def via_run(self, acct: int, key: str) -> str:
        result = self.store.run(scope=f"account:{acct}", operation=OPERATION, key=key, request=REQUEST,
                                effect=lambda conn: {"balance": self.debit(conn, acct)})
        return "replayed" if result.replayed else "applied"

    def plpgsql(self, acct: int, key: str) -> str:
        with self.engine.begin() as conn:
            reply = conn.execute(text(f"SELECT {self.pg_schema}.debit_once(:acct, :key, 1)"),
                                 {"acct": acct, "key": key}).scalar_one()
        if not isinstance(reply, dict) or "balance" not in reply:
            raise ExactlyOnceViolation(f"debit_once({acct}, {key!r}) returned {reply!r}")
        return "called"

    # what the database holds

    def balances(self, accounts: Sequence[int], plpgsql: bool = False) -> dict[int, int]:
        with self.engine.connect() as conn:
            if plpgsql:
                rows = conn.execute(text(f"SELECT account_id, balance FROM {self.pg_schema}.account"
                                         " WHERE account_id = ANY(:ids)"), {"ids": list(accounts)}).all()
            else:
                a = self.account.c
                rows = conn.execute(select(a.id, a.balance).where(a.id.in_(accounts))).all()
        return {int(i): INITIAL_BALANCE - int(b) for i, b in rows}

    def records(self, accounts: Sequence[int], plpgsql: bool = False) -> dict[int, tuple[int, int]]:
        """Per account: (records, completed records)."""
        with self.engine.connect() as conn:
            if plpgsql:
                rows = conn.execute(text(f"SELECT account_id, count(*), count(*) FROM {self.pg_schema}.request_result"
                                         " WHERE account_id = ANY(:ids) GROUP BY account_id"),
                                    {"ids": list(accounts)}).all()
                return {int(i): (int(n), int(d)) for i, n, d in rows}
            r = self.store.tables.records.c
            scopes = [f"account:{i}" for i in accounts]
            rows = conn.execute(select(r.scope, func.count(), func.count(r.completed_at))
                                .where(r.scope.in_(scopes)).group_by(r.scope)).all()
        return {int(s.split(":", 1)[1]): (int(n), int(d)) for s, n, d in rows}


def plpgsql_ddl(schema: str) -> list[str]:
    """Seed 000's tables and debit_once, verbatim but for the schema qualification."""
    return [
        f"CREATE SCHEMA {schema}",
        f"""CREATE TABLE {schema}.account (
    account_id bigint PRIMARY KEY,
    balance bigint NOT NULL CHECK (balance >= 0))""",
        f"""CREATE TABLE {schema}.request_result (
    account_id bigint NOT NULL REFERENCES {schema}.account (account_id),
    operation text COLLATE "C" NOT NULL,
    request_key text COLLATE "C" NOT NULL,
    request jsonb NOT NULL,
    response jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT request_result_pkey PRIMARY KEY (account_id, operation, request_key))""",
        f"""CREATE FUNCTION {schema}.debit_once(p_account bigint, p_key text, p_amount bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    supplied jsonb := jsonb_build_object('amount', p_amount);
    saved_request jsonb;
    reply jsonb;
    remaining bigint;
BEGIN
    IF p_key IS NULL OR p_key = '' OR p_amount IS NULL OR p_amount <= 0 THEN
        RAISE EXCEPTION 'key and positive amount required' USING ERRCODE = '22023';
    END IF;
    INSERT INTO {schema}.request_result (account_id, operation, request_key, request, response)
    VALUES (p_account, 'debit:v1', p_key, supplied, '{{}}'::jsonb)
    ON CONFLICT (account_id, operation, request_key) DO NOTHING;
    IF NOT FOUND THEN
        SELECT request, response INTO STRICT saved_request, reply
        FROM {schema}.request_result
        WHERE account_id = p_account AND operation = 'debit:v1' AND request_key = p_key;
        IF saved_request IS DISTINCT FROM supplied THEN
            RAISE EXCEPTION 'idempotency key reused with different request' USING ERRCODE = '22023';
        END IF;
        RETURN reply;
    END IF;
    UPDATE {schema}.account SET balance = balance - p_amount
    WHERE account_id = p_account AND balance >= p_amount
    RETURNING balance INTO remaining;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'insufficient balance' USING ERRCODE = 'P0001';
    END IF;
    reply := jsonb_build_object('balance', remaining);
    UPDATE {schema}.request_result SET response = reply
    WHERE account_id = p_account AND operation = 'debit:v1' AND request_key = p_key;
    RETURN reply;
END;
$$""",
    ]


# --- slices ------------------------------------------------------------------------------------------------------

Task = tuple[int, str]  # (account, key)


@dataclass
class Slice:
    """One mode's slice in one repetition: what each worker sends, and what the database must show after."""

    mode: str
    per_worker: list[list[Task]]
    expect_applied: int  # requests whose effect must run (the rest must replay)
    debits: Counter[int]  # account -> effects this slice must add
    new_keys: Counter[int]  # account -> distinct keys (records) this slice adds

    @property
    def size(self) -> int:
        return sum(len(w) for w in self.per_worker)


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def plan(mode: str, tag: str, cfg: Config, first_keys: dict[str, dict[str, list[list[Task]]]]) -> Slice:
    """The requests of one slice. `first_keys` remembers each `first` slice so `replay` can resend it."""
    n, base = cfg.workers, _ACCOUNT_BASE[mode]
    debits: Counter[int] = Counter()
    keys: Counter[int] = Counter()
    if mode == "contention":
        size = cfg.warmup if tag == "warmup" else cfg.requests
        distinct = max(1, size - round(size * cfg.duplicates))
        copies = [1] * distinct
        for j in range(size - distinct):
            copies[j % distinct] += 1
        # Copies of a key are consecutive, dealt round-robin: they reach different workers at the same moment.
        sequence = [k for k in range(distinct) for _ in range(copies[k])]
        per_worker: list[list[Task]] = [[] for _ in range(n)]
        for i, k in enumerate(sequence):
            per_worker[i % n].append((base + k % n, f"c{tag}-{k}"))
        for k in range(distinct):
            debits[base + k % n] += 1
            keys[base + k % n] += 1
        return Slice(mode, per_worker, distinct, debits, keys)
    if mode in ("replay", "plpgsql_replay"):
        source = first_keys["first" if mode == "replay" else "plpgsql_first"]
        per_worker = [list(tasks) for tasks in source[tag]] if tag in source else []
        return Slice(mode, per_worker, 0, debits, keys)
    per_worker = []
    for w, count in enumerate(_split(cfg.requests if tag != "warmup" else cfg.warmup, n)):
        acct = base + w
        per_worker.append([(acct, f"{mode[0]}{tag}-{w}-{i}") for i in range(count)])
        debits[acct] += count
        if mode != "bare":
            keys[acct] += count
    if mode in ("first", "plpgsql_first"):
        first_keys.setdefault(mode, {})[tag] = per_worker
    return Slice(mode, per_worker, sum(debits.values()), debits, keys)


@dataclass
class SliceResult:
    seconds: float
    latencies: list[float]
    outcomes: Counter[str]
    retries: Counter[str]


# --- the benchmark -----------------------------------------------------------------------------------------------


@dataclass
class ModeStats:
    throughputs: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    statements: StatementLog | None = None


class Bench:
    def __init__(self, store: IdempotencyStore, cfg: Config, log: Callable[[str], None] = lambda s: None) -> None:
        self.store = store
        self.cfg = cfg
        self.log = log
        self.workload = Workload(store)
        self.plpgsql = store.backend.name == "postgresql"
        self.modes = ["bare", *IDEM_MODES, *(PLPGSQL_MODES if self.plpgsql else ())]
        self.stats = {m: ModeStats() for m in self.modes}
        self.first_keys: dict[str, dict[str, list[list[Task]]]] = {}
        self.expected_debits: Counter[int] = Counter()
        self.expected_keys: Counter[int] = Counter()
        self.checks = 0
        self.memory: dict[str, Any] | None = None
        self.profile: str | None = None

    def accounts(self) -> list[int]:
        blocks = sorted(set(_ACCOUNT_BASE.values()))
        return [b + w for b in blocks for w in range(self.cfg.workers)]

    def request_fn(self, mode: str) -> Callable[[int, str], str]:
        if mode == "bare":
            return self.workload.bare
        if mode in PLPGSQL_MODES:
            return self.workload.plpgsql
        return self.workload.via_run

    def execute(self, s: Slice) -> SliceResult:
        """Send the slice's requests, one thread per worker, and time the whole slice."""
        fn = self.request_fn(s.mode)
        lat: list[list[float]] = [[] for _ in s.per_worker]
        outs: list[Counter[str]] = [Counter() for _ in s.per_worker]
        errors: list[BaseException] = []
        before = Counter(self.store.retries) + Counter(self.workload.retries)

        def work(w: int) -> None:
            times, out, clock = lat[w], outs[w], time.perf_counter
            try:
                for acct, key in s.per_worker[w]:
                    t0 = clock()
                    out[fn(acct, key)] += 1
                    times.append(clock() - t0)
            except BaseException as exc:
                errors.append(exc)

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
        if errors:
            raise errors[0]
        after = Counter(self.store.retries) + Counter(self.workload.retries)
        outcomes: Counter[str] = sum(outs, Counter())
        return SliceResult(seconds, [x for ts in lat for x in ts], outcomes, after - before)

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
        """In the database: debits per account == distinct keys sent to it; as many records, all complete."""
        self.checks += 1
        plpgsql = mode in PLPGSQL_MODES
        debited = self.workload.balances(accounts, plpgsql)
        for acct in accounts:
            if debited.get(acct, 0) != self.expected_debits[acct]:
                raise ExactlyOnceViolation(
                    f"{mode}: account {acct} was debited {debited.get(acct, 0)} times, expected"
                    f" {self.expected_debits[acct]} (one per distinct key)")
        if mode == "bare":
            return
        records = self.workload.records(accounts, plpgsql)
        for acct in accounts:
            total, done = records.get(acct, (0, 0))
            want = self.expected_keys[acct]
            if total != want or done != want or want != self.expected_debits[acct]:
                raise ExactlyOnceViolation(
                    f"{mode}: account {acct} has {total} idempotency records ({done} completed) and"
                    f" {debited.get(acct, 0)} debits for {want} distinct keys")

    def run_slice(self, mode: str, tag: str, measured: bool, cfg: Config | None = None) -> None:
        s = plan(mode, tag, cfg or self.cfg, self.first_keys)
        if not s.size:
            return
        result = self.execute(s)
        self.verify(s, result)
        st = self.stats[mode]
        if measured:
            st.retries.update(result.retries)
            st.outcomes.update(result.outcomes)
            st.throughputs.append(s.size / result.seconds)
            st.latencies.extend(result.latencies)
            st.requests += s.size

    def run(self) -> None:
        self.workload.create(self.accounts(), self.plpgsql)
        try:
            if self.cfg.warmup:
                for mode in self.modes:
                    self.run_slice(mode, "warmup", measured=False)
            for rep in range(self.cfg.repetitions):
                for mode in self.modes:
                    self.run_slice(mode, str(rep), measured=True)
                self.log(f"repetition {rep + 1}/{self.cfg.repetitions}: "
                         + ", ".join(f"{m} {self.stats[m].throughputs[-1]:,.0f}/s" for m in self.modes))
            self.count_statements()
            if self.cfg.profile:
                self.profile = self.run_profile(self.cfg.profile)
            if self.cfg.memory_check:
                self.memory = self.memory_check(self.cfg.memory_check)
        finally:
            self.workload.drop()

    def count_statements(self) -> None:
        """One more request per mode, sequential, with every statement and commit logged."""
        for mode in self.modes:
            s = plan(mode, "count", Config(workers=1, requests=1, duplicates=0.0), self.first_keys)
            fn = self.request_fn(mode)
            ((acct, key),) = s.per_worker[0]
            with record_statements(self.store.engine) as log:
                fn(acct, key)
            self.stats[mode].statements = log
            if mode not in ("replay", "plpgsql_replay"):
                self.expected_debits[acct] += 1
                self.expected_keys[acct] += mode != "bare"

    def run_profile(self, mode: str) -> str:
        """cProfile over one unmeasured slice of `mode` at one worker: where the time goes, top functions."""
        cfg1 = Config(workers=1, requests=self.cfg.requests, duplicates=self.cfg.duplicates)
        if mode in ("replay", "plpgsql_replay"):
            self.run_slice("first" if mode == "replay" else "plpgsql_first", "profile", measured=False, cfg=cfg1)
        s = plan(mode, "profile", cfg1, self.first_keys)
        profiler = cProfile.Profile()
        profiler.enable()
        result = self.execute(s)
        profiler.disable()
        self.verify(s, result)
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).strip_dirs()
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(25)
        return out.getvalue()

    def memory_check(self, total: int) -> dict[str, Any]:
        """`total` requests at one worker -- a first-time request, then its replay, in turn -- under tracemalloc."""
        acct, run = _ACCOUNT_BASE["memory"], self.workload.via_run
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
        slope = _slope(tail)
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

    # --- the report ------------------------------------------------------------------------------------------

    def report(self, engine_info: dict[str, Any], elapsed: float) -> dict[str, Any]:
        medians = {m: statistics.median(st.throughputs) for m, st in self.stats.items() if st.throughputs}
        bare = self.stats["bare"].throughputs
        modes: dict[str, Any] = {}
        for m, st in self.stats.items():
            if not st.throughputs:
                continue
            paired = [t / b for t, b in zip(st.throughputs, bare, strict=False)]
            log = st.statements
            modes[m] = {
                "requests": st.requests,
                "throughput_per_s": {"median": round(medians[m], 1),
                                     "per_repetition": [round(t, 1) for t in st.throughputs]},
                "ratio_to_bare": round(medians[m] / medians["bare"], 3),
                "ratio_to_bare_paired": round(statistics.median(paired), 3),
                "latency_ms": _percentiles(st.latencies),
                "outcomes": dict(sorted(st.outcomes.items())),
                "retries": dict(sorted(st.retries.items())),
                "statements": None if log is None else {
                    "count": len(log.statements), "kinds": log.kinds, "commits": log.commits},
            }
        targets = []
        for name, num, den, minimum in TARGETS:
            if num in medians and den in medians:
                ratio = medians[num] / medians[den]
                targets.append({"target": name, "ratio": round(ratio, 3), "minimum": minimum, "met": ratio >= minimum})
        if self.memory is not None:
            targets.append({"target": "memory flat (growth < 8 KiB per 10k requests)",
                            "growth_per_10k_kib": self.memory["growth_per_10k_kib"], "met": self.memory["flat"]})
        total_debits = sum(v for k, v in self.expected_debits.items() if k >= _ACCOUNT_BASE["first"])
        total_keys = sum(v for k, v in self.expected_keys.items())
        return {
            "schema": SCHEMA,
            "engine": engine_info,
            "config": {"workers": self.cfg.workers, "requests": self.cfg.requests,
                       "duplicates": self.cfg.duplicates, "repetitions": self.cfg.repetitions,
                       "warmup": self.cfg.warmup, "memory_check": self.cfg.memory_check},
            "bare_effect": ("UPDATE account SET balance = balance - 1 WHERE id = ? ; SELECT balance"
                            " -- one transaction begun by store.transaction(), no idempotency"),
            "implicit_begin": implicit_begin(self.store.engine),
            "modes": modes,
            "exactly_once": {"verified": True, "checks": self.checks, "effects": total_debits,
                             "distinct_keys": total_keys},
            "targets": targets,
            "memory": {"peak_rss_mib": round(peak_rss_mib(), 1), "check": self.memory},
            "elapsed_s": round(elapsed, 2),
        }


def _slope(points: Sequence[tuple[int, int]]) -> float:
    if len(points) < 2:
        return 0.0
    xs, ys = [float(p[0]) for p in points], [float(p[1]) for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def _percentiles(latencies: Sequence[float]) -> dict[str, float]:
    if not latencies:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(latencies)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": round(ordered[-1] * 1000, 3)}


def peak_rss_mib() -> float:
    """The process's peak resident set size (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def engine_info(store: IdempotencyStore) -> dict[str, Any]:
    engine = store.engine
    version: str | None
    if engine.dialect.name == "sqlite":
        import sqlite3

        version = sqlite3.sqlite_version
    else:
        with engine.connect() as conn:
            info = conn.dialect.server_version_info
        version = ".".join(str(p) for p in info) if info else None
    return {
        "url": engine.url.render_as_string(hide_password=True),
        "backend": store.backend.name,
        "dialect": engine.dialect.name,
        "driver": engine.dialect.driver,
        "server_version": version,
        "python": sys.version.split()[0],
    }


def new_prefix() -> str:
    return f"bench_{secrets.token_hex(3)}_"
