"""The sync store's own BEGIN and COMMIT on psycopg (libpq's blocking PQexec, `drivers/psycopg.py`): a transaction
keeps the isolation level the engine asks for, a BEGIN on a connection lost while pooled is retried as a lost
connection, and a COMMIT that fails is raised as the async store's native COMMIT raises it, nothing kept.

The statement that opens a transaction goes in one query with its BEGIN, as EXECUTE of a statement the store
prepared on the connection: values that need quoting arrive byte for byte, and a statement dropped (psycopg's
DEALLOCATE ALL), already there, or out of date (its table altered) is prepared again without a second effect."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

import pytest
from pg_common import *  # noqa: F403  (fixtures: admin, effects, make_store, pg, store)
from pg_common import REQ, backend_pid
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import IntegrityError

from idem_dialects import IdempotencyStore
from idem_dialects.conformance.support import Effects, effects_table, stores
from idem_dialects.engines import Server
from idem_dialects.errors import RetryCause
from idem_dialects.outcomes import Claimed, Replayed

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


@pytest.mark.parametrize("level", ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"])
def test_transactions_keep_the_engines_isolation_level(make_store: Callable[..., IdempotencyStore],
                                                       level: str) -> None:
    store = make_store(isolation_level=level)
    with store.transaction() as conn:
        assert conn.execute(text("SHOW transaction_isolation")).scalar_one() == level.lower()
    seen: list[str] = []

    def effect(conn: Connection) -> dict[str, str]:
        seen.append(conn.execute(text("SHOW transaction_isolation")).scalar_one())
        return {"ok": "1"}

    store.run(scope="s", operation="op", key=secrets.token_hex(8), request=REQ, effect=effect)
    assert seen == [level.lower()]


def _terminate(admin: Engine, pid: int) -> None:
    with admin.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
        deadline = time.monotonic() + 20
        while conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}).scalar_one():
            assert time.monotonic() < deadline, f"backend {pid} still there"
            time.sleep(0.01)


def test_begin_on_a_connection_lost_while_pooled_is_retried(make_store: Callable[..., IdempotencyStore],
                                                            admin: Engine) -> None:
    store = make_store(pool_size=1, max_overflow=0)
    with effects_table(store) as fx:
        store.run(scope="s", operation="op", key="warm", request=REQ, effect=fx.effect("warm"))
        with store.engine.connect() as conn:
            pid = backend_pid(conn)
        _terminate(admin, pid)
        key = secrets.token_hex(8)
        first = store.run(scope="s", operation="op", key=key, request=REQ, effect=fx.effect(key))
        assert not first.replayed
        assert store.retries[RetryCause.CONNECTION] == 1
        assert fx.count(key) == 1
        again = store.run(scope="s", operation="op", key=key, request=REQ, effect=fx.effect(key))
        assert again.replayed and again.response == first.response
        assert fx.count(key) == 1


@pytest.fixture
def deferred(store: IdempotencyStore) -> Iterator[str]:
    """A table whose unique constraint is checked at COMMIT: an effect that violates it fails only there."""
    table = f"{store.table_prefix}deferred"
    with store.engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} (v int, UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)"))
    yield table
    with store.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {table}"))


def _violating(table: str) -> Callable[[Connection], dict[str, int]]:
    def effect(conn: Connection) -> dict[str, int]:
        conn.execute(text(f"INSERT INTO {table} VALUES (1), (1)"))  # accepted until COMMIT checks it
        return {"ok": 1}

    return effect


def test_commit_failure_is_raised_as_by_the_async_store(pg: Server, store: IdempotencyStore, deferred: str) -> None:
    pytest.importorskip("greenlet", reason="greenlet is not installed (pip install 'idem-dialects[async]')")
    from idem_dialects import AsyncIdempotencyStore
    key = secrets.token_hex(8)
    with pytest.raises(IntegrityError) as sync_error:
        store.run(scope="s", operation="op", key=key, request=REQ, effect=_violating(deferred))

    async def through_async() -> IntegrityError:
        url = make_url(pg.url).set(drivername="postgresql+psycopg")
        async with AsyncIdempotencyStore.from_url(url, table_prefix=store.table_prefix) as astore:
            with pytest.raises(IntegrityError) as caught:
                await astore.run(scope="s", operation="op", key=key, request=REQ, effect=_async_violating(deferred))
        return caught.value

    async_error = asyncio.run(through_async())
    assert type(sync_error.value) is type(async_error)
    assert type(sync_error.value.orig) is type(async_error.orig)
    assert getattr(sync_error.value.orig, "sqlstate", None) == "23505"
    with store.engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {deferred}")).scalar_one() == 0
    # Nothing of the key was kept: its next request runs its effect, on the same pooled connection.
    fresh = store.run(scope="s", operation="op", key=key, request=REQ, effect=lambda conn: {"ok": 2})
    assert not fresh.replayed and fresh.response == {"ok": 2}


def _async_violating(table: str) -> Callable[[AsyncConnection], Awaitable[dict[str, int]]]:
    async def effect(conn: AsyncConnection) -> dict[str, int]:
        await conn.execute(text(f"INSERT INTO {table} VALUES (1), (1)"))
        return {"ok": 1}

    return effect


# --- the claim sent with its BEGIN -------------------------------------------------------------------------------


def _prepared_by_store(conn: Connection) -> list[str]:
    return list(conn.execute(text("SELECT name FROM pg_prepared_statements WHERE name LIKE 'idem\\_%'")).scalars())


def test_odd_keys_arrive_byte_for_byte(store: IdempotencyStore, effects: Effects) -> None:
    """Quotes, backslashes, what looks like a placeholder or a statement: quoted as literals, stored as sent."""
    keys = ["it's", "back\\slash", "E'\\x00'", "$1", "%(k_scope)s", "%%", "'); DROP TABLE x; --", "ключ-ü-🔑"]
    for key in keys:
        first = store.run(scope="s'\\", operation="op", key=key, request=REQ, effect=effects.effect(key))
        again = store.run(scope="s'\\", operation="op", key=key, request=REQ, effect=effects.effect(key))
        assert not first.replayed and again.replayed and again.response == first.response
    with store.engine.connect() as conn:
        assert _prepared_by_store(conn)  # the path under test: the claim went as EXECUTE of the store's statement
        stored = conn.execute(text(f"SELECT scope, idem_key FROM {store.table_prefix}records")).all()
        assert sorted(stored) == sorted(("s'\\", key) for key in keys)
    assert effects.per_key() == dict.fromkeys(keys, 1)


@pytest.mark.parametrize("drop", ["deallocated", "rolled back", "forgotten"])
def test_a_statement_dropped_or_already_there_is_prepared_again(make_store: Callable[..., IdempotencyStore],
                                                                drop: str) -> None:
    """"deallocated": DEALLOCATE ALL drops the store's statements unseen (committed, no rollback): the next claim's
    EXECUTE fails before anything ran and is sent again with its PREPARE. "rolled back": psycopg, once it prepared
    statements of its own, deallocates every one after a rollback; the store, told of the rollback, prepares its
    statement with the next claim. "forgotten": the store no longer knows its statement is there, and its PREPARE
    fails as a duplicate: then it uses it."""
    from idem_dialects.drivers import psycopg as driver

    store = make_store(pool_size=1, max_overflow=0)
    with effects_table(store) as fx:
        for round_ in range(3):
            key = f"k{round_}"
            first = store.run(scope="s", operation="op", key=key, request=REQ, effect=fx.effect(key))
            with store.engine.connect() as conn:
                assert _prepared_by_store(conn)
                if drop == "forgotten":
                    driver._PREPARED.pop(conn.connection.dbapi_connection)
                elif drop == "deallocated":
                    conn.exec_driver_sql("DEALLOCATE ALL")
                    conn.commit()
                else:
                    for _ in range(6):  # psycopg prepares a statement at its 5th execution
                        conn.exec_driver_sql("SELECT 1")
                    conn.rollback()
                    assert _prepared_by_store(conn) == []
                    conn.rollback()
            again = store.run(scope="s", operation="op", key=key, request=REQ, effect=fx.effect(key))
            assert not first.replayed and again.replayed and again.response == first.response
            assert fx.count(key) == 1
        with store.engine.connect() as conn:
            assert _prepared_by_store(conn)
        assert store.retries.total() == 0  # put right inside the statement, not by `run` retrying


def test_a_statement_out_of_date_is_prepared_again(store: IdempotencyStore, effects: Effects) -> None:
    """A prepared statement whose result's type changed (its table altered) fails ("cached plan must not change
    result type") before anything ran: the store deallocates it and prepares it again."""
    first = store.run(scope="s", operation="op", key="k", request=REQ, effect=effects.effect("k"))
    with store.engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE {store.table_prefix}records ALTER COLUMN status TYPE bigint"))
    for _ in range(2):
        again = store.run(scope="s", operation="op", key="k", request=REQ, effect=effects.effect("k"))
        assert again.replayed and again.response == first.response and again.status == first.status
    assert effects.count("k") == 1


def test_without_prepared_statements_the_claim_goes_on_psycopgs_cursor(make_store: Callable[..., IdempotencyStore],
                                                                       effects: Effects) -> None:
    """Where psycopg prepares nothing (as behind a transaction-mode pooler), neither does the store."""
    store = make_store(connect_args={"prepare_threshold": None})
    for key in ("a", "b"):
        store.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key))
        assert store.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key)).replayed
    with store.engine.connect() as conn:
        assert _prepared_by_store(conn) == []
    assert effects.per_key() == {"a": 1, "b": 1}


def test_a_response_never_goes_into_the_querys_text(make_store: Callable[..., IdempotencyStore]) -> None:
    """The completion opens its transaction in external-call mode, but it carries the response: psycopg sends it as
    a parameter (no literal for a server log or pg_stat_activity to show), and the replay returns it byte for byte."""
    store = make_store(pool_size=1, max_overflow=0)
    response = bytes(range(256)) * 4  # NUL, quotes, backslashes, high bytes
    for key in ("k0", "k1"):  # the engine's first connection opens without prepared statements (`pooler.py`)
        with store.transaction() as conn:
            claimed = store.claim(conn, scope="s", operation="op", key=key, request=REQ)
        assert isinstance(claimed, Claimed)
        with store.transaction() as conn:
            store.complete(conn, claimed, response, status=201)
        with store.transaction() as conn:
            again = store.claim(conn, scope="s", operation="op", key=key, request=REQ)
        assert isinstance(again, Replayed) and again.status == 201 and again.response == response
    with store.engine.connect() as conn:
        prepared = conn.execute(text("SELECT statement FROM pg_prepared_statements WHERE name LIKE 'idem\\_%'"))
        statements = list(prepared.scalars())
        conn.commit()
    assert statements and any("INSERT INTO" in sql for sql in statements)  # the claim's
    assert not any("UPDATE" in sql for sql in statements), statements  # not the completion's (an UPDATE of the record)


def test_a_replay_is_two_round_trips_whatever_was_rolled_back_before(pg: Server) -> None:
    """The claim with its BEGIN, then the COMMIT, counted on the wire: with the store's statement prepared, after a
    rollback psycopg sends (which deallocates it: the claim's query prepares it again), and after a connection goes
    back to the pool idle (no rollback sent: nothing dropped, nothing prepared twice)."""
    from idem_dialects_bench.wire import through_proxy

    with through_proxy(make_url(pg.url)) as wire, stores(wire.reach(make_url(pg.url)), "pgw_") as make:
        store = make(pool_size=1, max_overflow=0)
        for key in ("k0", "k1"):  # the engine's first connection opens without prepared statements (`pooler.py`)
            store.run(scope="s", operation="op", key=key, request=REQ, effect=lambda conn: {"ok": 1})

        def round_trips() -> int:
            with wire.window() as window:
                assert store.run(scope="s", operation="op", key="k1", request=REQ, effect=_never).replayed
            return window.counts.round_trips

        assert round_trips() == 2
        with store.engine.connect() as conn:
            for _ in range(6):  # psycopg prepares a statement of its own at its 5th execution
                conn.exec_driver_sql("SELECT 1")
            conn.rollback()  # ROLLBACK, then psycopg's DEALLOCATE ALL
            assert conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar_one() == 0
            conn.commit()
        assert [round_trips(), round_trips()] == [2, 2]
        with store.engine.connect():
            pass  # given back idle
        assert round_trips() == 2


def _never(conn: Connection) -> None:
    raise AssertionError("a replay ran its effect")


def test_the_async_store_on_psycopg_rolls_back_as_before(pg: Server, store: IdempotencyStore) -> None:
    """The sync store's listeners (psycopg's rollbacks drop its prepared statements) are not on async engines, whose
    connections are SQLAlchemy's adapters: an effect's error rolls back and reaches the caller unchanged."""
    pytest.importorskip("greenlet", reason="greenlet is not installed (pip install 'idem-dialects[async]')")
    from idem_dialects import AsyncIdempotencyStore

    class Refused(Exception):
        pass

    async def effect(conn: AsyncConnection) -> None:
        await conn.execute(text("SELECT 1"))
        raise Refused

    async def main() -> None:
        url = make_url(pg.url).set(drivername="postgresql+psycopg")
        async with AsyncIdempotencyStore.from_url(url, table_prefix=store.table_prefix) as astore:
            for _ in range(3):
                with pytest.raises(Refused):
                    await astore.run(scope="s", operation="op", key="k", request=REQ, effect=effect)
            async with astore.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
                await conn.rollback()
            assert astore.retries.total() == 0

    asyncio.run(main())


def test_a_connection_closed_is_not_kept(make_store: Callable[..., IdempotencyStore]) -> None:
    """What the store knows of a connection's statements goes with the connection."""
    import gc
    import weakref

    store = make_store(pool_size=1, max_overflow=0)
    for key in ("k0", "k1"):  # the engine's first connection opens without prepared statements (`pooler.py`)
        store.run(scope="s", operation="op", key=key, request=REQ, effect=lambda conn: {"ok": 1})
    with store.engine.connect() as conn:
        dbapi = weakref.ref(conn.connection.dbapi_connection)
        conn.rollback()
    from idem_dialects.drivers import psycopg as driver

    assert dbapi() in driver._PREPARED
    store.engine.dispose()
    gc.collect()
    assert dbapi() is None
