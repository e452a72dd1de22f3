"""What retention costs (`idem-dialects bench URL --measure purge`): how long it takes to remove the old records,
and what it does to the claims running beside it.

`rows` records completed two days ago and `recent` ones completed now are inserted (server-side, INSERT ... SELECT
over a digits table, so ten million rows take minutes, not hours), then first-time runs (worker threads, each its
own connection) are timed twice: alone, and while retention removes the old rows. The removal runs in a process of
its own, as `idem-dialects purge` (or a scheduled job) does: run as a thread beside the claimers it would share their
interpreter's lock, each of its statements waiting for a turn, which is no cost a purge has in production (and a
paced purge would pause in proportion to it). `mode` says how it removes them:

- ``delete``: `purge(older_than=1 day)` as shipped: paced batches of at most `batch_size` (`pace`: the library's
  default unless given), the completion index walked range by range (MySQL/MariaDB: at READ COMMITTED);
- ``delete-default-isolation``: the same batches at the server's default isolation, as releases before generations
  purged (the "before" of MySQL/MariaDB);
- ``generations``: the old rows are the previous generation (`create_tables(generations=True)`) and `purge` drops
  it whole.

The report gives the removal's seconds and rows/s and the claims' throughput and latency (p50/p99/max) alone
(before and after) and beside the removal, and their ratio: the lock and CPU impact on concurrent claims. Beside the
removal is measured twice: over the removal itself (`claims_during_removal`: the claims that ended inside it, and
the latency of every claim that overlapped it, the longest of them included), which is what a rotation of
generations costs the claims while it holds its locks; and over a window of at least DURING_FLOOR seconds from its
start (`claims_during_purge`), which dilutes a removal shorter than that in the claims after it.
"""

from __future__ import annotations

import json
import secrets
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import Column, Integer, LargeBinary, MetaData, String, Table, cast, func, literal, select, true
from sqlalchemy.engine import URL
from sqlalchemy.exc import SAWarning

from idem_dialects.cli.output import Log
from idem_dialects.dialects.base import Backend
from idem_dialects.retention import purge_targets
from idem_dialects.steps import Flow, transaction
from idem_dialects.store import IdempotencyStore

from .runner import BenchFailed, scratch_store

SCHEMA = "idem-dialects-bench-purge/3"  # /3: the removal in a process of its own, and its own window
MODES = ("delete", "delete-default-isolation", "generations")
_AGE = 2 * 86400.0  # the old records completed two days ago; purge keeps one day
BASELINE_SECONDS = 10.0  # how long the claims run alone (before and after), for what retention is compared with
SETTLE_SECONDS = 5.0
DURING_FLOOR = 2.0


class PurgeBenchmark:
    """The `Benchmark` (runner.py) of retention's cost on one database."""

    def __init__(self, rows: int = 100_000, batch_size: int = 1000, workers: int = 2, recent: int = 0,
                 purge_mode: str = "delete", pace: float | None = None) -> None:
        if purge_mode not in MODES:
            raise ValueError(f"--purge-mode must be one of {', '.join(MODES)}, got {purge_mode!r}")
        if pace is not None and not 0 < pace <= 1:
            raise ValueError(f"--pace must be above 0 and at most 1, got {pace!r}")
        self.rows, self.batch_size, self.workers, self.recent, self.mode = rows, batch_size, workers, recent, \
            purge_mode
        self.pace = pace

    def refuse(self, backend: type[Backend]) -> str | None:
        return None

    def measure(self, url: URL, log: Log) -> dict[str, Any]:
        with scratch_store(url, self.workers + 2) as (store, info):
            return measure(store, self.rows, self.batch_size, self.workers, log, self.recent, self.mode,
                           self.pace) | {"engine": info}


def fill(store: IdempotencyStore, rows: int, table: Table | None = None, age: float = _AGE, scope: str = "old") -> None:
    """`rows` records of `scope` completed `age` seconds ago by the database's clock, inserted by the server from a
    cross join of a ten-row digits table, a million rows per statement (portable SQL: SQLAlchemy spells the string
    concatenation and the cast for each engine)."""
    t, backend = table if table is not None else store.tables.records, store.backend
    digits = Table(f"{store.table_prefix}digits", MetaData(),
                   Column("n", Integer, primary_key=True, autoincrement=False))
    with store.engine.begin() as conn:
        digits.create(conn, checkfirst=True)
        if not conn.execute(select(func.count()).select_from(digits)).scalar_one():
            conn.execute(digits.insert(), [{"n": n} for n in range(10)])
    try:
        width = max(1, len(str(max(rows - 1, 1))))
        low = min(width, 6)  # a million combinations per statement
        copies = [digits.alias(f"d{i}") for i in range(low)]
        joined: Any = copies[0]
        for other in copies[1:]:
            joined = joined.join(other, true())  # a cross join, said so
        old = backend.now_plus(-age)
        token = secrets.token_hex(16)
        for high in range(0, rows, 10 ** low):
            number = literal(high) + sum((c.c.n * 10 ** i for i, c in enumerate(copies)), literal(0))
            key = literal(f"{scope}-", String) + cast(number, String)
            query = select(literal(scope, String), literal("fill:v1", String), key, literal("0" * 64, String),
                           literal(token, String), old, old, old, literal(200), literal(b'{"ok":1}', LargeBinary)
                           ).select_from(joined).where(number < rows)
            cols = ["scope", "operation", "idem_key", "fingerprint", "claim_token", "created_at", "locked_until",
                    "completed_at", "status", "response"]
            with store.engine.begin() as conn, warnings.catch_warnings():
                warnings.simplefilter("ignore", SAWarning)  # the cartesian product is the point
                conn.execute(t.insert().from_select(cols, query))
    finally:
        with store.engine.begin() as conn:
            digits.drop(conn, checkfirst=True)


Span = tuple[float, float]  # one claim's start and end, time.monotonic seconds


def _claims(store: IdempotencyStore, workers: int, until: Callable[[], bool]) -> tuple[list[Span], float]:
    """First-time runs on `workers` threads until `until()`: each one's start and end, and the elapsed seconds."""
    spans: list[Span] = []
    lock = threading.Lock()

    def work(worker: int) -> None:
        n = 0
        while not until():
            started = time.monotonic()
            store.run(scope=f"w{worker}", operation="claim:v1", key=secrets.token_hex(8), request={"n": n},
                      effect=lambda conn: {"ok": 1})
            with lock:
                spans.append((started, time.monotonic()))
            n += 1

    started = time.monotonic()
    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return spans, time.monotonic() - started


def _summary(spans: list[Span], seconds: float) -> dict[str, Any]:
    """Claims/s over `seconds`, and the latencies (ms) of `spans`: median, 99th percentile, longest."""
    ordered = sorted((end - start) * 1000 for start, end in spans) or [0.0]
    return {"claims": len(spans), "claims_per_s": len(spans) / seconds if seconds else 0.0,
            "p50_ms": statistics.median(ordered), "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
            "max_ms": ordered[-1]}


def _within(spans: list[Span], start: float, end: float) -> dict[str, Any]:
    """The claims beside the removal itself, from `start` to `end`: their rate is the claims that ended inside it
    over its length; their latencies are those of every claim that overlapped it (one that waited on the removal's
    lock from before it began and ended after it counts), so `max_ms` is the longest claim during the removal."""
    ended = sum(1 for _, done in spans if start <= done <= end)
    overlapping = [(s, e) for s, e in spans if s < end and e > start]
    return _summary(overlapping, end - start) | {"claims": ended, "claims_per_s": ended / (end - start),
                                                  "seconds": end - start}


def _default_isolation_purge(store: IdempotencyStore, batch_size: int) -> int:
    """Purge as releases before generations did: each batch at the server's default isolation (`Begin.STORE`)."""
    def batches() -> Flow[int]:
        total = 0
        for table, condition in purge_targets(store.tables, store.backend, timedelta(days=1)).items():
            while True:
                def batch(table: Any = table, condition: Any = condition) -> Flow[int]:
                    return transaction(store.backend.purge_batch(table, condition, batch_size))

                deleted = yield from store.claims.retrying(batch)  # retried like purge's own batches
                total += deleted
                if deleted < batch_size:
                    break
        return total

    return store.drive(batches())


# The purge, in a process of its own as `idem-dialects purge` runs: started before the claims' first baseline, it
# connects, says "ready", and purges when told to, then prints what it removed and when (time.monotonic, which is
# the system's monotonic clock: the claims' spans are on it too).
_PURGER = """
import json, sys, time
from datetime import timedelta
from idem_dialects.store import IdempotencyStore
spec = json.loads(sys.argv[1])
with IdempotencyStore.from_url(spec["url"], table_prefix=spec["prefix"]) as store:
    with store.engine.connect():
        pass
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    if spec["mode"] == "delete-default-isolation":
        from idem_dialects_bench.purge import _default_isolation_purge
        removed = _default_isolation_purge(store, spec["batch_size"])
    else:
        removed = store.purge(older_than=timedelta(days=1), batch_size=spec["batch_size"], **spec["paced"])
    print(json.dumps({"rows": removed, "start": start, "end": time.monotonic()}), flush=True)
"""


class _Purger:
    """The purge's process: `start()` once it is ready, `wait()` for what it reports."""

    def __init__(self, store: IdempotencyStore, mode: str, batch_size: int, pace: float | None) -> None:
        spec = {"url": store.engine.url.render_as_string(hide_password=False), "prefix": store.table_prefix,
                "mode": mode, "batch_size": batch_size, "paced": {} if pace is None else {"pace": pace}}
        self.process = subprocess.Popen([sys.executable, "-c", _PURGER, json.dumps(spec)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.process.stdout is not None and self.process.stdin is not None
        if self.process.stdout.readline().strip() != "ready":
            raise BenchFailed(f"the purge's process did not start: {self._error()}")
        self.done = threading.Event()
        self.report: dict[str, Any] = {}

    def start(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            line = self.process.stdout.readline()
            self.report = json.loads(line) if line.strip() else {}
        except ValueError:
            self.report = {}
        finally:
            self.done.set()

    def wait(self) -> dict[str, Any]:
        self.done.wait()
        _, err = self.process.communicate()  # its end, and its pipes closed
        if self.process.returncode != 0 or "rows" not in self.report:
            raise BenchFailed(f"the purge failed: {_last_line(err)}")
        return self.report

    def _error(self) -> str:
        self.process.kill()
        _, err = self.process.communicate()
        return _last_line(err)


def _last_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else "no output"


def measure(store: IdempotencyStore, rows: int, batch_size: int, workers: int, log: Callable[[str], None],
            recent: int = 0, mode: str = "delete", pace: float | None = None) -> dict[str, Any]:
    generations = mode == "generations"
    store.create_tables(generations=generations)
    log(f"inserting {rows:,} records completed two days ago and {recent:,} completed now")
    fill(store, rows, store.tables.previous if generations else None)
    if recent:
        fill(store, recent, age=0.0, scope="recent")
    time.sleep(SETTLE_SECONDS)  # the server's own work after a bulk load (checkpoint, statistics) is not the purge's
    purger = _Purger(store, mode, batch_size, pace)  # its interpreter's start is no part of any measurement
    log(f"{workers} workers claiming alone for {BASELINE_SECONDS:.0f}s")
    deadline = time.monotonic() + BASELINE_SECONDS
    alone = _summary(*_claims(store, workers, lambda: time.monotonic() > deadline))

    log(f"removing the old records ({mode}, in a process of its own) while {workers} workers claim")
    purger.start()
    # At least DURING_FLOOR seconds: a removal that takes milliseconds must not be judged on a handful of claims, nor
    # diluted in seconds of claims after it (the window is the removal's, plus the floor's rest).
    floor = time.monotonic() + DURING_FLOOR
    spans, seconds = _claims(store, workers, lambda: purger.done.is_set() and time.monotonic() > floor)
    purged = purger.wait()
    purged["seconds"] = purged["end"] - purged["start"]
    during = _summary(spans, seconds)
    removal = _within(spans, purged["start"], purged["end"])
    # Alone again, after: on a shared machine the claims' rate drifts; the ratio is to the mean of before and after.
    deadline = time.monotonic() + BASELINE_SECONDS
    after = _summary(*_claims(store, workers, lambda: time.monotonic() > deadline))
    with store.engine.connect() as conn:
        left = sum(conn.execute(select(func.count()).select_from(t).where(t.c.scope == "old")).scalar_one()
                   for t in (store.tables.records, *([store.tables.previous] if generations else [])))
    if left:
        raise BenchFailed(f"retention removed {purged.get('rows')} of {rows} old records ({left} left)")
    reference = (alone["claims_per_s"] + after["claims_per_s"]) / 2
    return {"schema": SCHEMA, "rows": rows, "recent": recent, "mode": mode, "batch_size": batch_size, "pace": pace,
            "workers": workers, "purge": {"seconds": purged["seconds"], "rows_per_s": rows / purged["seconds"]},
            "claims_alone": alone, "claims_during_removal": removal, "claims_during_purge": during,
            "claims_after": after,
            "kept_ratio_removal": removal["claims_per_s"] / reference if reference else None,
            "kept_ratio": during["claims_per_s"] / reference if reference else None}
