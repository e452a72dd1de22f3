"""MySQL/MariaDB on a live server, continued: the loser sees the committed winner (locking reads), the
classification of retryable errors that really happen (deadlocks, lock wait timeouts, MariaDB's snapshot
isolation), and the engine facts the protocol relies on.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mysql_common import *  # noqa: F403  (fixtures: admin, make_database, make_store, server, server_url)
from mysql_common import BACKENDS, REQ, _records, _respond, pymysql
from sqlalchemy import create_engine, select, text, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from idem_dialects import Claimed, IdempotencyStore, InFlight, Replayed
from idem_dialects.conformance.support import Effects
from idem_dialects.dialects.mysql import MariaDBBackend, MySQLBackend
from idem_dialects.dialects.mysql_errors import error_code
from idem_dialects.errors import RetryCause

# --- the loser sees the committed winner --------------------------------------------------------------------


@pytest.mark.parametrize("level", ["REPEATABLE READ", "READ COMMITTED", "SERIALIZABLE"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_claim_after_earlier_read_sees_winner(make_store: Callable[..., IdempotencyStore], backend: str,
                                              level: str) -> None:
    """A transaction that read before the winner committed replays it (claim and message) at every level."""
    store = make_store(backend, isolation_level=level)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {store.table_prefix}other (x INT) ENGINE=InnoDB")
    try:
        with store.engine.connect() as reader:
            tx = reader.begin()
            # Any consistent read fixes a REPEATABLE READ snapshot; this one takes no lock the winner needs.
            reader.exec_driver_sql(f"SELECT * FROM {store.table_prefix}other").all()
            store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "winner")
            with store.transaction() as conn:
                assert store.accept_message(conn, subscriber="sub", message_id="m")
            outcome = store.claim(reader, scope="s", operation="op", key="k", request=REQ)
            assert isinstance(outcome, Replayed) and outcome.response == "winner"
            assert store.accept_message(reader, subscriber="sub", message_id="m") is False
            tx.rollback()
    finally:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {store.table_prefix}other")


def _has_variable(engine: Engine, name: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SHOW VARIABLES LIKE :n"), {"n": name}).first() is not None


def test_mariadb_snapshot_isolation_is_retried(make_store: Callable[..., IdempotencyStore]) -> None:
    """MariaDB with innodb_snapshot_isolation=ON (the default from 11.6) refuses a locking read of a row newer
    than the snapshot with 1020; it is a serialization failure, and run absorbs it."""
    store = make_store("mariadb", connect_args={"init_command": "SET SESSION innodb_snapshot_isolation=ON"})
    if not _has_variable(store.engine, "innodb_snapshot_isolation"):
        pytest.skip("this server has no innodb_snapshot_isolation")
    with store.engine.connect() as reader:
        tx = reader.begin()
        reader.execute(select(store.tables.records)).all()
        store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "winner")
        try:
            outcome = store.claim(reader, scope="s", operation="op", key="k", request=REQ)
            assert isinstance(outcome, Replayed)
        except DBAPIError as exc:
            assert error_code(exc) == 1020 and store.retry_cause(exc) == RetryCause.SERIALIZATION
        tx.rollback()
    effects = Effects(store)
    effects.create()
    try:
        barrier = threading.Barrier(8)
        results: list[Any] = []

        def call() -> None:
            barrier.wait()
            try:
                results.append(store.run(scope="s", operation="op", key="race", request=REQ,
                                         effect=effects.effect("race")))
            except Exception as exc:  # collected for the assertion
                results.append(exc)

        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r for r in results if isinstance(r, Exception)] == [] and effects.count("race") == 1
    finally:
        effects.drop()


# --- retryable errors ---------------------------------------------------------------------------------------


def _wrapped(code: int) -> DBAPIError:
    return OperationalError("SELECT 1", {}, pymysql.err.OperationalError(code, "test"))


@pytest.mark.parametrize("backend", [MySQLBackend, MariaDBBackend], ids=["mysql", "mariadb"])
def test_retry_classification(backend: type[MySQLBackend]) -> None:
    """Deadlock, lock wait timeout and lost connection (by code, or as SQLAlchemy invalidated the connection) are
    retryable; nothing else is (1020 only on MariaDB)."""
    b = backend(create_engine(f"{backend.name}+pymysql://u@h/db"))  # classification needs no connection
    assert b.errors.retry_cause(_wrapped(1213)) == RetryCause.DEADLOCK
    assert b.errors.retry_cause(_wrapped(1205)) == RetryCause.LOCK_TIMEOUT
    assert b.errors.retry_cause(_wrapped(2006)) == RetryCause.CONNECTION
    assert b.errors.retry_cause(_wrapped(2013)) == RetryCause.CONNECTION
    for code in (1062, 1048, 1406, 1452, 1064, 2014, 2003):
        assert b.errors.retry_cause(_wrapped(code)) is None, code
    integrity = IntegrityError("INSERT", {}, pymysql.err.IntegrityError(1062, "Duplicate entry"))
    assert b.errors.is_duplicate(integrity) and b.errors.retry_cause(integrity) is None
    assert not b.errors.is_duplicate(IntegrityError("INSERT", {}, pymysql.err.IntegrityError(1048, "null")))
    assert b.errors.retry_cause(RuntimeError("1213")) is None
    assert b.errors.retry_cause(_wrapped(1020)) == (RetryCause.SERIALIZATION if backend is MariaDBBackend else None)
    invalidated = OperationalError("SELECT 1", {}, pymysql.err.InterfaceError(0, ""), connection_invalidated=True)
    assert b.errors.retry_cause(invalidated) == RetryCause.CONNECTION  # SQLAlchemy's own disconnect detection


def _wait_for_lock_waits(store: IdempotencyStore, count: int, timeout: float = 30.0) -> None:
    """Block until `count` INSERTs into this store's records table have been running for a second or more: with the
    first inserter's transaction open, they can only be waiting for its row lock (a fixed sleep is not enough on a
    loaded machine). The process list, not INNODB_TRX: MariaDB serves INNODB_TRX from a cache that may not list
    a waiting transaction yet (seen here: both INSERTs blocked for 4 s, neither in INNODB_TRX)."""
    deadline = time.monotonic() + timeout
    query = ("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' AND TIME >= 1"
             " AND INFO LIKE %s")
    with store.engine.connect() as probe:
        while time.monotonic() < deadline:
            waiting = probe.exec_driver_sql(query, (f"INSERT INTO {store.tables.records.name} %",)).scalar()
            probe.rollback()
            if int(waiting or 0) >= count:
                return
            time.sleep(0.05)
    raise AssertionError(f"{count} waiting inserts never appeared within {timeout}s")


@pytest.mark.parametrize("backend", BACKENDS)
def test_rolled_back_first_inserter_deadlock_is_classified(make_store: Callable[..., IdempotencyStore],
                                                           backend: str) -> None:
    """InnoDB's textbook deadlock: three inserts of one key, the first rolls back; a waiter becomes the
    deadlock victim (1213), classified as retryable, and the other one gets the key."""
    store = make_store(backend)
    t = store.tables.records
    values = dict(scope="s", operation="op", idem_key="k", fingerprint="f", claim_token="t")
    clock = {"created_at": 0.0, "locked_until": 0.0}
    outcomes: list[Any] = []

    def waiter() -> None:
        try:
            with store.transaction() as conn:
                outcomes.append(store.drive(store.backend.insert_if_absent(t, values, clock), conn))
        except DBAPIError as exc:
            outcomes.append(exc)

    with store.engine.connect() as first:
        tx = first.begin()
        assert store.drive(store.backend.insert_if_absent(t, values, clock), first)
        threads = [threading.Thread(target=waiter) for _ in range(2)]
        for th in threads:
            th.start()
        _wait_for_lock_waits(store, 2)  # both wait on the first inserter's lock
        tx.rollback()
        for th in threads:
            th.join()
    errors = [o for o in outcomes if isinstance(o, DBAPIError)]
    assert sorted(map(repr, outcomes)) == sorted(map(repr, [True, *errors])) and len(errors) == 1, outcomes
    assert store.retry_cause(errors[0]) == RetryCause.DEADLOCK and error_code(errors[0]) == 1213
    assert len(_records(store)) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_lock_wait_timeout_is_classified(make_store: Callable[..., IdempotencyStore], backend: str) -> None:
    """A claim stuck behind an uncommitted claim past innodb_lock_wait_timeout raises 1205, retryable."""
    store = make_store(backend, connect_args={"init_command": "SET SESSION innodb_lock_wait_timeout=1"})
    with store.transaction() as holder:
        assert isinstance(store.claim(holder, scope="s", operation="op", key="k", request=REQ), Claimed)
        with pytest.raises(OperationalError) as err, store.transaction() as conn:
            store.claim(conn, scope="s", operation="op", key="k", request=REQ)
        assert error_code(err.value) == 1205 and store.retry_cause(err.value) == RetryCause.LOCK_TIMEOUT


# --- engine facts the protocol relies on --------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_rowcount_counts_matched_rows(make_store: Callable[..., IdempotencyStore], backend: str) -> None:
    """CLIENT.FOUND_ROWS is on: an UPDATE that matches a row but changes nothing still reports 1 (the fenced
    takeover and complete count matches, not changes)."""
    store = make_store(backend)
    with store.transaction() as conn:
        claimed = store.claim(conn, scope="s", operation="op", key="k", request=REQ)
        assert isinstance(claimed, Claimed)
        t = store.tables.records
        same = conn.execute(update(t).where(t.c.idem_key == "k").values(claim_token=claimed.token))
        assert same.rowcount == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_session_time_zone_does_not_matter(make_store: Callable[..., IdempotencyStore], backend: str) -> None:
    """Leases use UTC_TIMESTAMP(6): stores whose sessions sit in different time zones agree on them."""
    east = make_store(backend, connect_args={"init_command": "SET time_zone='+10:00'"})
    west = make_store(backend, connect_args={"init_command": "SET time_zone='-10:00'"})
    with east.transaction() as conn:
        first = east.claim(conn, scope="s", operation="op", key="k", request=REQ, lease=timedelta(seconds=30))
    assert isinstance(first, Claimed)
    with west.transaction() as conn:
        busy = west.claim(conn, scope="s", operation="op", key="k", request=REQ, lease=timedelta(seconds=30))
    assert isinstance(busy, InFlight) and 25 < busy.retry_after <= 30
    (row,) = _records(west)
    utc_now = datetime.now(UTC).replace(tzinfo=None)
    assert abs((row.created_at - utc_now).total_seconds()) < 60
    assert abs((row.locked_until - row.created_at).total_seconds() - 30) < 0.01


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_response_and_purge_batches(make_store: Callable[..., IdempotencyStore], backend: str) -> None:
    """A 4 MB response round-trips through LONGBLOB; purge deletes in DELETE ... LIMIT batches."""
    store = make_store(backend)
    blob = secrets.token_bytes(4 * 1024 * 1024)
    store.run(scope="s", operation="op", key="big", request=REQ, effect=lambda conn: blob)
    assert store.run(scope="s", operation="op", key="big", request=REQ, effect=lambda conn: b"").response == blob
    for i in range(5):
        store.run(scope="s", operation="op", key=f"k{i}", request=REQ, effect=_respond(i))
    assert store.purge(older_than=timedelta(0), batch_size=2) == 6
    assert _records(store) == []



@pytest.mark.parametrize("level", ["REPEATABLE READ", "READ COMMITTED"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_failing_winner_deadlocks_are_absorbed(make_store: Callable[..., IdempotencyStore], backend: str,
                                               level: str) -> None:
    """7 claims queued behind a winner whose effect fails: when it rolls back, InnoDB deadlocks the queued
    inserters on the freed key; run retries the victims, so exactly one effect lands and only the failing
    caller sees an error."""
    store = make_store(backend, isolation_level=level)
    effects = Effects(store)
    effects.create()
    first = threading.Event()
    lock = threading.Lock()
    barrier = threading.Barrier(8)
    results: list[Any] = []

    def effect(conn: Connection) -> Any:
        with lock:
            failing = not first.is_set()
            first.set()
        if failing:
            time.sleep(0.3)  # the other 7 queue on the uncommitted claim
            raise RuntimeError("winner failed")
        return effects.apply(conn, "k")

    def call() -> None:
        barrier.wait()
        try:
            results.append(store.run(scope="s", operation="op", key="k", request=REQ, effect=effect))
        except Exception as exc:  # collected for the assertion
            results.append(exc)

    try:
        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        errors = [r for r in results if isinstance(r, Exception)]
        assert [str(e) for e in errors] == ["winner failed"]
        assert effects.count("k") == 1 and sum(not r.replayed for r in results if r not in errors) == 1
        # Victims (if InnoDB picked any this round: it depends on who queued first) were retried, not surfaced.
        assert set(store.retries) <= {RetryCause.DEADLOCK}, store.retries
    finally:
        effects.drop()
