"""What relaying costs (`idem-dialects bench URL --measure outbox`): commands published per second by 1 and by 4
relays (threads, a connection each) sharing one outbox through the engine's skip-locked claim.

`rows` pending commands over 1,000 scopes are inserted, then the relays drain them to a publisher that only counts
(the database's side is what is measured: claim, lease, mark); every command must be published exactly once, or the
run fails. Each level is measured on a freshly filled outbox.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import URL

from idem_dialects.cli.output import Log
from idem_dialects.dialects.base import Backend
from idem_dialects.fingerprint import encode_response
from idem_dialects.outbox import Command
from idem_dialects.relay import Relay
from idem_dialects.schema import PENDING
from idem_dialects.store import IdempotencyStore

from .runner import scratch_store
from .workload import exactly_once

SCHEMA = "idem-dialects-bench-outbox/1"
LEVELS = (1, 4)
_FILL_CHUNK = 2000
_SCOPES = 1000


class _Counting:
    def __init__(self) -> None:
        self.ids: Counter[str] = Counter()
        self.lock = threading.Lock()

    def publish(self, command: Command) -> None:
        with self.lock:
            self.ids[command.id] += 1


class OutboxBenchmark:
    """The `Benchmark` (runner.py) of relay throughput on one database."""

    def __init__(self, rows: int = 20_000, batch_size: int = 100, workers: int | None = None) -> None:
        self.rows, self.batch_size = rows, batch_size
        self.levels = LEVELS if workers is None else (workers,)

    def refuse(self, backend: type[Backend]) -> str | None:
        return None

    def measure(self, url: URL, log: Log) -> dict[str, Any]:
        with scratch_store(url, max(self.levels) + 2) as (store, info):
            store.create_tables()
            return {"schema": SCHEMA, "rows": self.rows, "batch_size": self.batch_size, "engine": info,
                    "levels": [relay_rate(store, self.rows, self.batch_size, n, log) for n in self.levels]}


def fill(store: IdempotencyStore, rows: int) -> list[str]:
    t = store.tables.outbox
    stmt = t.insert().values(created_at=store.backend.now(), available_at=store.backend.now())
    ids = []
    payload, headers = encode_response({"amount": 1}), encode_response({})
    for start in range(0, rows, _FILL_CHUNK):
        batch = []
        for n in range(start, min(rows, start + _FILL_CHUNK)):
            ids.append(str(uuid.uuid4()))
            batch.append({"command_id": ids[-1], "scope": f"s{n % _SCOPES}", "operation": "bench:v1",
                          "idem_key": f"k{n}", "seq": 0, "destination": "bench", "payload": payload,
                          "headers": headers, "state": PENDING, "attempts": 0})
        with store.transaction() as conn:
            conn.execute(stmt, batch)
    return ids


def relay_rate(store: IdempotencyStore, rows: int, batch: int, relays: int,
               log: Callable[[str], None]) -> dict[str, Any]:
    with store.transaction() as conn:
        conn.execute(store.tables.outbox.delete())
    log(f"filling the outbox with {rows:,} commands over {_SCOPES} scopes")
    ids = fill(store, rows)
    sink = _Counting()
    workers = [Relay(store, {"*": sink}, batch=batch, stats_every=0) for _ in range(relays)]
    log(f"{relays} relay(s) draining it")

    def drain(relay: Relay) -> None:
        while relay.run_once():
            pass

    started = time.perf_counter()
    threads = [threading.Thread(target=drain, args=(r,)) for r in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    exactly_once(f"{relays} relays' publications", sink.ids, dict.fromkeys(ids, 1))
    return {"relays": relays, "seconds": seconds, "commands_per_s": rows / seconds,
            "rounds": sum(r.metrics.rounds for r in workers)}
