"""What purge costs (`idem-dialects bench URL --measure purge`): rows deleted per second, and what it does to the
claims running beside it.

`rows` completed records two days old are inserted, then first-time runs (worker threads, each its own connection)
are timed twice: alone, and while `purge(older_than=1 day)` deletes the old rows in batches. The report gives purge's
rows/s and the claims' latency (p50/p99/max) and throughput in both phases: the lock impact on concurrent claims.
"""

from __future__ import annotations

import secrets
import statistics
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import URL

from ...dialects.base import Backend
from ...store import IdempotencyStore
from .runner import BenchFailed, Log, scratch_store

SCHEMA = "idem-dialects-bench-purge/1"
_AGE = 2 * 86400.0  # the filled records completed two days ago; purge keeps one day
_FILL_CHUNK = 5000
BASELINE_SECONDS = 5.0  # how long the claims run alone, for the latencies purge is compared with


class PurgeBenchmark:
    """The `Benchmark` (runner.py) of purge's cost on one database."""

    def __init__(self, rows: int = 100_000, batch_size: int = 1000, workers: int = 2) -> None:
        self.rows, self.batch_size, self.workers = rows, batch_size, workers

    def refuse(self, backend: type[Backend]) -> str | None:
        return None

    def measure(self, url: URL, log: Log) -> dict[str, Any]:
        with scratch_store(url, self.workers + 2) as (store, info):
            return measure(store, self.rows, self.batch_size, self.workers, log) | {"engine": info}


def fill(store: IdempotencyStore, rows: int) -> None:
    """`rows` records completed `_AGE` seconds ago by the database's clock, in chunks of one transaction each."""
    t, backend = store.tables.records, store.backend
    old = backend.now_plus(-_AGE)
    stmt = t.insert().values(created_at=old, locked_until=old, completed_at=old)
    token = secrets.token_hex(16)
    for start in range(0, rows, _FILL_CHUNK):
        batch = [{"scope": "old", "operation": "fill:v1", "idem_key": f"k{n}", "fingerprint": "0" * 64,
                  "claim_token": token, "status": 200, "response": b'{"ok":1}'}
                 for n in range(start, min(rows, start + _FILL_CHUNK))]
        with store.transaction() as conn:
            conn.execute(stmt, batch)


def _claims(store: IdempotencyStore, workers: int, until: Callable[[], bool]) -> tuple[list[float], float]:
    """First-time runs on `workers` threads until `until()`: each one's latency (ms), and the elapsed seconds."""
    latencies: list[float] = []
    lock = threading.Lock()

    def work(worker: int) -> None:
        n = 0
        while not until():
            started = time.perf_counter()
            store.run(scope=f"w{worker}", operation="claim:v1", key=secrets.token_hex(8), request={"n": n},
                      effect=lambda conn: {"ok": 1})
            with lock:
                latencies.append((time.perf_counter() - started) * 1000)
            n += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, time.perf_counter() - started


def _summary(latencies: list[float], seconds: float) -> dict[str, Any]:
    ordered = sorted(latencies) or [0.0]
    return {"claims": len(latencies), "claims_per_s": len(latencies) / seconds if seconds else 0.0,
            "p50_ms": statistics.median(ordered), "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
            "max_ms": ordered[-1]}


def measure(store: IdempotencyStore, rows: int, batch_size: int, workers: int,
            log: Callable[[str], None]) -> dict[str, Any]:
    baseline_seconds = BASELINE_SECONDS
    store.create_tables()
    log(f"inserting {rows:,} records completed two days ago")
    fill(store, rows)
    log(f"{workers} workers claiming alone for {baseline_seconds:.0f}s")
    deadline = time.perf_counter() + baseline_seconds
    alone = _summary(*_claims(store, workers, lambda: time.perf_counter() > deadline))

    done = threading.Event()
    purged: dict[str, Any] = {}

    def purge() -> None:
        started = time.perf_counter()
        try:
            purged["rows"] = store.purge(older_than=timedelta(days=1), batch_size=batch_size)
        finally:
            purged["seconds"] = time.perf_counter() - started
            done.set()

    log(f"purging in batches of {batch_size:,} while {workers} workers claim")
    purger = threading.Thread(target=purge)
    purger.start()
    during = _summary(*_claims(store, workers, done.is_set))
    purger.join()
    with store.engine.connect() as conn:
        left = conn.execute(select(func.count()).select_from(store.tables.records)
                            .where(store.tables.records.c.scope == "old")).scalar_one()
    if purged.get("rows") != rows or left:
        raise BenchFailed(f"purge deleted {purged.get('rows')} of {rows} old records ({left} left)")
    return {"schema": SCHEMA, "rows": rows, "batch_size": batch_size, "workers": workers,
            "purge": {"seconds": purged["seconds"], "rows_per_s": rows / purged["seconds"]},
            "claims_alone": alone, "claims_during_purge": during}


def render(report: dict[str, Any]) -> str:
    engine, purge = report.get("engine", {}), report["purge"]
    lines = [f"purge: {engine.get('backend', '?')} {engine.get('server_version', '')}: {report['rows']:,} rows in"
             f" batches of {report['batch_size']:,}: {purge['seconds']:.2f} s, {purge['rows_per_s']:,.0f} rows/s",
             f"{'first-time claims, ' + str(report['workers']) + ' workers':<38} {'claims/s':>9} {'p50 ms':>7}"
             f" {'p99 ms':>7} {'max ms':>7}"]
    for label, key in (("alone", "claims_alone"), ("during purge", "claims_during_purge")):
        row = report[key]
        lines.append(f"  {label:<36} {row['claims_per_s']:>9.0f} {row['p50_ms']:>7.2f} {row['p99_ms']:>7.2f}"
                     f" {row['max_ms']:>7.1f}")
    return "\n".join(lines) + "\n"
