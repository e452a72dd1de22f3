"""Through a transaction-mode pooler (the `pgbouncer-transaction` engine: PgBouncer with pool_mode=transaction, the
URL saying ``?pooler=transaction``), many runs on many connections: every call returns, every key is applied once.
Without the option psycopg prepares a statement after its 5th execution and asyncpg prepares every one, and the next
transaction on another server session fails with "prepared statement ... does not exist / already exists"."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from idem_dialects import IdempotencyStore, Result
from idem_dialects.conformance.plugin import EngineUnderTest
from idem_dialects.conformance.support import Effects

WORKERS, CALLS = 8, 3200


def test_transaction_pooler_runs(idem_engine: EngineUnderTest, idem_make_store: Callable[..., IdempotencyStore],
                                 idem_observe: Callable[[str, object], None]) -> None:
    """3,200 runs of unique keys on 8 threads (sync store) or 8 tasks (async store, one column per driver): no
    error, one record and one effect per key."""
    if idem_engine.features.session_state:
        pytest.skip(f"{idem_engine.name}: no transaction-mode pooler declared (the URL has no pooler=transaction)")
    store = idem_make_store(pool_size=WORKERS, max_overflow=0)
    effects = Effects(store)
    effects.create()
    keys = [[f"pool-{w}-{i}" for i in range(CALLS // WORKERS)] for w in range(WORKERS)]
    results: list[Result] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(WORKERS)

    def worker(mine: list[str]) -> None:
        barrier.wait()
        for key in mine:
            try:
                result = store.run(scope="s", operation="op", key=key, request={"n": 1}, effect=effects.effect(key))
            except Exception as exc:  # collected: the check says which calls failed
                with lock:
                    errors.append(exc)
                continue
            with lock:
                results.append(result)

    threads = [threading.Thread(target=worker, args=(mine,)) for mine in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == [], f"{len(errors)} of {CALLS} calls failed, e.g. {errors[:3]!r}"
        assert len(results) == CALLS and not any(r.replayed for r in results)
        assert effects.per_key() == {k: 1 for mine in keys for k in mine}
        records = store.tables.records
        with store.engine.connect() as conn:
            stored: Any = conn.execute(select(func.count()).select_from(records)).scalar_one()
        assert stored == CALLS
    finally:
        effects.drop()
    idem_observe(f"transaction pooler: {CALLS} runs on {WORKERS} workers", "0 errors, every key once")
