"""PostgreSQL test fixtures and helpers shared by tests/test_postgresql*.py: one server per engine (18 embedded and
the machine's 15), stores on fresh tables, and ways to watch a race (pg_blocking_pids) instead of sleeping."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, Engine

from idem_dialects import IdempotencyStore
from idem_dialects.conformance.support import Effects, effects_table, stores
from idem_dialects.engines import Server, Unavailable, get

REQ = {"amount": 100}
LEVELS = ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
SNAPSHOT_LEVELS = {"REPEATABLE READ", "SERIALIZABLE"}


# --- servers and stores ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["postgresql-18", "postgresql"])
def pg(request: pytest.FixtureRequest) -> Server:
    """One server per engine, started once per test module that uses it (each imports this fixture) and stopped
    after it."""
    name: str = request.param
    try:
        server = get(name).provide()
    except Unavailable as exc:
        pytest.skip(f"{name} unavailable: {exc}")
    request.addfinalizer(server.stop)
    return server


@pytest.fixture
def admin(pg: Server) -> Iterator[Engine]:
    engine = create_engine(pg.url, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture
def make_store(pg: Server) -> Iterator[Callable[..., IdempotencyStore]]:
    """Stores sharing one fresh set of tables (isolated by prefix); keyword arguments go to create_engine."""
    with stores(pg.url, f"pg{secrets.token_hex(4)}_") as make:
        yield make


@pytest.fixture
def store(make_store: Callable[..., IdempotencyStore]) -> IdempotencyStore:
    return make_store()


@pytest.fixture
def effects(store: IdempotencyStore) -> Iterator[Effects]:
    """The business table effects write to, beside `store`'s tables."""
    with effects_table(store) as fx:
        yield fx


def backend_pid(conn: Connection) -> int:
    """The server process of `conn`, read in a transaction of its own (so no snapshot is left behind)."""
    pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
    conn.rollback()
    return pid


def wait_until_blocked(admin: Engine, waiter: int, holder: int, timeout: float = 20.0) -> None:
    """Return once `waiter` is waiting on a lock `holder` has: the race is set up, with no timing guess."""
    deadline = time.monotonic() + timeout
    with admin.connect() as conn:
        while time.monotonic() < deadline:
            blockers = conn.execute(text("SELECT pg_blocking_pids(:pid)"), {"pid": waiter}).scalar_one()
            if holder in blockers:
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {waiter} never waited on {holder}")


def claim_in_transaction(store: IdempotencyStore, conn: Connection, key: str = "k", **kw: Any) -> Any:
    """A step-by-step claim in a fresh transaction on `conn`, rolled back afterwards: returns the outcome."""
    tx = conn.begin()
    try:
        return store.claim(conn, scope="s", operation="op", key=key, request=REQ, **kw)
    finally:
        tx.rollback()
