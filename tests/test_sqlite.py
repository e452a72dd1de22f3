"""SQLite specifics: the write lock taken at BEGIN, WAL, busy errors absorbed by run, :memory: use."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from idem_dialects_bench import statement_kind
from sqlalchemy import create_engine, text

from idem_dialects import IdempotencyStore, RetriesExhausted, RetryPolicy
from idem_dialects.conformance.support import StatementLog
from idem_dialects.errors import InsufficientPrivilege, RetryCause


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "idem.db"


@pytest.fixture
def store(db: Path) -> Iterator[IdempotencyStore]:
    store = IdempotencyStore.from_url(f"sqlite:///{db}", connect_args={"timeout": 0.05})
    store.create_tables()
    yield store
    store.engine.dispose()


def hold_write_lock(db: Path, seconds: float, release: threading.Event | None = None) -> threading.Thread:
    """Another connection takes the write lock and keeps it for `seconds`, or until `release` is set."""
    locked = threading.Event()

    def hold() -> None:
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        locked.set()
        if release is None:
            time.sleep(seconds)
        else:
            release.wait(seconds)
        other.execute("COMMIT")
        other.close()

    thread = threading.Thread(target=hold)
    thread.start()
    locked.wait()
    return thread


def test_transaction_takes_write_lock_at_begin(db: Path) -> None:
    """store.transaction() begins with the write lock; run's claim reads first and takes the lock before any
    write by restarting as BEGIN IMMEDIATE (never by upgrading its read transaction)."""
    log = StatementLog()
    with IdempotencyStore.from_url(f"sqlite:///{db}", statement_hook=log) as store:
        store.create_tables()
        log.sql.clear()
        with store.transaction():
            pass
        assert [statement_kind(s) for s in log.sql] == ["BEGIN IMMEDIATE"]
        log.sql.clear()
        store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1)
    kinds = [statement_kind(s) for s in log.sql]
    first_write = next(i for i, kind in enumerate(kinds) if kind in ("INSERT", "UPDATE"))
    assert kinds[:first_write] == ["BEGIN", "SELECT", "ROLLBACK", "BEGIN IMMEDIATE"]


def test_replay_runs_beside_a_writer(store: IdempotencyStore, db: Path) -> None:
    """A replay takes no write lock: with another connection holding it (and a busy timeout of 50 ms, no retries)
    the replay still answers, from WAL."""
    store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "first")
    writer = hold_write_lock(db, 0.5)
    try:
        again = store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "second",
                          retry=RetryPolicy(max_attempts=1))
    finally:
        writer.join()
    assert (again.response, again.replayed) == ("first", True)


def test_read_only_database_replays(store: IdempotencyStore, db: Path) -> None:
    """A read-only connection to the database (mode=ro) replays a stored response; a new key fails to claim."""
    store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "first")
    with store.engine.connect():  # keep the -wal/-shm files a read-only connection needs
        ro = IdempotencyStore.from_url(f"sqlite:///file:{db}?mode=ro&uri=true")
        try:
            again = ro.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "second")
            assert (again.response, again.replayed) == ("first", True)
            with pytest.raises(InsufficientPrivilege):  # SQLite's "attempt to write a readonly database"
                ro.run(scope="s", operation="op", key="new", request={}, effect=lambda conn: "x")
        finally:
            ro.close()


def test_file_database_uses_wal(store: IdempotencyStore) -> None:
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_user_transactions_keep_driver_defaults(db: Path) -> None:
    """Wrapping a user's engine changes nothing for their own transactions: the pooled connection's
    isolation_level is restored after each store transaction."""
    engine = create_engine(f"sqlite:///{db}", pool_size=1)
    store = IdempotencyStore(engine)
    store.create_tables()
    store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1)
    with engine.connect() as conn:
        assert conn.connection.driver_connection.isolation_level == ""  # type: ignore[union-attr]
    engine.dispose()


def test_busy_is_absorbed_by_run(store: IdempotencyStore, db: Path) -> None:
    """A writer holding the lock longer than the busy timeout: run waits it out through retries."""
    holder = hold_write_lock(db, 0.4)
    result = store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "done")
    holder.join()
    assert result.response == "done" and store.retries[RetryCause.BUSY] >= 1


@pytest.mark.parametrize("budget", ["attempts", "time"])
def test_retry_exhaustion_says_what_and_how_often(db: Path, store: IdempotencyStore, budget: str) -> None:
    """A lock held until the test releases it: run gives up by its policy while the holder still holds the lock
    (so the policy, not the holder, ended it), whatever the machine's load: three attempts exactly when the policy
    counts them; at least one, and a budget spent to its last wait, when it times them."""
    release = threading.Event()
    holder = hold_write_lock(db, 120, release)
    policy = (RetryPolicy(total=120, initial=0.01, max_wait=0.05, max_attempts=3) if budget == "attempts" else
              RetryPolicy(total=0.3, initial=0.01, max_wait=0.05))
    try:
        with pytest.raises(RetriesExhausted) as err:
            store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1, retry=policy)
        assert holder.is_alive()  # still holding: the policy gave up, the lock did not go away
    finally:
        release.set()
        holder.join()
    attempts = err.value.attempts
    assert attempts == 3 if budget == "attempts" else attempts >= 1
    assert err.value.causes == {RetryCause.BUSY: attempts}
    if budget == "time":  # stopped because the next wait would pass the budget, not earlier
        assert err.value.elapsed > policy.total - policy.max_wait
    assert isinstance(err.value.__cause__, Exception) and err.value.last_error is err.value.__cause__
    assert "busy" in str(err.value) and f"{attempts} attempt" in str(err.value)


def test_memory_database_serialises_threads() -> None:
    """:memory: is one shared connection: threads take turns instead of seeing different empty databases."""
    store = IdempotencyStore.from_url("sqlite://")
    store.create_tables()
    effects: list[int] = []
    barrier = threading.Barrier(8)

    def call(i: int) -> Any:
        barrier.wait()
        return store.run(scope="s", operation="op", key="k", request={},
                         effect=lambda conn: effects.append(i) or i)

    results: list[Any] = []
    threads = [threading.Thread(target=lambda i=i: results.append(call(i))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(effects) == 1 and {r.response for r in results} == {effects[0]}
    assert sum(r.replayed for r in results) == 7
    assert not store.features.processes and not store.features.concurrent_connections


def test_duplicate_is_classified_by_extended_code(store: IdempotencyStore) -> None:
    """PRIMARY KEY / UNIQUE violations are duplicates; NOT NULL and CHECK violations are not."""
    from sqlalchemy.exc import IntegrityError

    errors = {}
    violations = {
        "pk": "INSERT INTO t VALUES (1, 'b', 'x', 1)",
        "unique": "INSERT INTO t VALUES (2, 'a', 'x', 1)",
        "notnull": "INSERT INTO t VALUES (3, 'c', NULL, 1)",
        "check": "INSERT INTO t VALUES (4, 'd', 'x', 0)",
    }
    with store.engine.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INT PRIMARY KEY, u TEXT UNIQUE, n TEXT NOT NULL, c INT CHECK (c>0))")
        conn.exec_driver_sql("INSERT INTO t VALUES (1, 'a', 'x', 1)")
        for name, sql in violations.items():
            with pytest.raises(IntegrityError) as err:
                conn.execute(text(sql))
            errors[name] = store.backend.errors.is_duplicate(err.value)
    assert errors == {"pk": True, "unique": True, "notnull": False, "check": False}


def test_memory_engine_without_shared_connection_warns() -> None:
    with pytest.warns(UserWarning, match="its own empty database"):
        IdempotencyStore(create_engine("sqlite://"))


@pytest.mark.parametrize("api", ["sync", "async"])
def test_conflict_mode_is_in_flight_for_the_key_held_and_another_key_waits(db: Path, api: str) -> None:
    """on_in_flight="conflict" (issue 47): SQLite's write lock is the database's, but only the key a write
    transaction holds is answered in flight; a claim of another key waits for the lock and then runs."""
    import asyncio

    from async_common import async_store_class

    from idem_dialects import RequestInFlight

    holder = IdempotencyStore.from_url(f"sqlite:///{db}")
    holder.create_tables()
    started, gate = threading.Event(), threading.Event()

    def held(conn: Any) -> str:
        started.set()
        assert gate.wait(30)
        return "first"

    first = threading.Thread(target=lambda: holder.run(scope="s", operation="op", key="k1", request={}, effect=held))
    first.start()
    outcomes: dict[str, Any] = {}
    try:
        assert started.wait(30)
        if api == "sync":
            store = IdempotencyStore.from_url(f"sqlite:///{db}")

            def claim(key: str) -> Any:
                return store.run(scope="s", operation="op", key=key, request={}, on_in_flight="conflict",
                                 effect=lambda conn: key)
        else:
            store = async_store_class("aiosqlite").from_url(f"sqlite+aiosqlite:///{db}")

            def claim(key: str) -> Any:
                async def effect(conn: Any) -> str:
                    return key
                return asyncio.run(store.run(scope="s", operation="op", key=key, request={},
                                             on_in_flight="conflict", effect=effect))
        with pytest.raises(RequestInFlight):
            claim("k1")
        other = threading.Thread(target=lambda: outcomes.update(k2=claim("k2")))
        other.start()  # waits on the write lock, the holder's (another key)
    finally:
        gate.set()
        first.join(30)
    other.join(30)
    assert outcomes["k2"].response == "k2" and not outcomes["k2"].replayed
    again = claim("k1")
    assert again.replayed and again.response == "first"
    holder.engine.dispose()
    if api == "sync":
        store.engine.dispose()


def test_conflict_mode_answers_a_duplicate_of_a_claim_still_waiting_for_the_lock_in_flight(db: Path) -> None:
    """on_in_flight="conflict": a claim of k2 waits for the write lock, which a writer of k1 holds; a duplicate of k2
    arriving meanwhile is answered in flight while the writer still holds the lock (it lets go once the duplicate
    has its answer, or after 30 s, well within the 60 s busy timeout), and the waiting claim then runs, once. Before
    k2 was noted ahead of the lock, the duplicate waited for the lock too, and replayed or ran k2 after the writer."""
    from idem_dialects import RequestInFlight
    from idem_dialects.dialects import sqlite as dialect

    holder = IdempotencyStore.from_url(f"sqlite:///{db}")
    holder.create_tables()
    store = IdempotencyStore.from_url(f"sqlite:///{db}?timeout=60")
    started, answered = threading.Event(), threading.Event()

    def held(conn: Any) -> str:
        started.set()
        answered.wait(30)
        return "k1"

    def claim(key: str) -> Any:
        return store.run(scope="s", operation="op", key=key, request={}, on_in_flight="conflict",
                         effect=lambda conn: effects.append(key) or key)

    effects: list[str] = []
    outcomes: dict[str, Any] = {}
    first = threading.Thread(target=lambda: holder.run(scope="s", operation="op", key="k1", request={}, effect=held))
    first.start()
    assert started.wait(30)
    waiting = threading.Thread(target=lambda: outcomes.update(k2=claim("k2")))
    waiting.start()
    k2 = store.backend._held_key(store.tables.records, {"scope": "s", "operation": "op", "idem_key": "k2"})
    while dialect._HELD.noted(k2) == 0:  # the claim of k2 noted it, and asks for the lock
        time.sleep(0.01)
    try:
        with pytest.raises(RequestInFlight):
            claim("k2")
        assert first.is_alive() and not answered.is_set()  # answered while the writer of k1 still held the lock
    finally:
        answered.set()
        first.join(30)
        waiting.join(30)
    assert outcomes["k2"].response == "k2" and not outcomes["k2"].replayed and effects == ["k2"]
    holder.engine.dispose()
    store.engine.dispose()
