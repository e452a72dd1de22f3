"""The sync store's own BEGIN and COMMIT on psycopg (libpq's blocking PQexec, `drivers/psycopg.py`): a transaction
keeps the isolation level the engine asks for, a BEGIN on a connection lost while pooled is retried as a lost
connection, and a COMMIT that fails is raised as the async store's native COMMIT raises it, nothing kept."""

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
from idem_dialects.conformance.support import effects_table
from idem_dialects.engines import Server
from idem_dialects.errors import RetryCause

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
