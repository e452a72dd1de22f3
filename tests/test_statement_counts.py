"""How many SQL statements each path of `run` sends, per backend: a structural test, not a timing test.

Counted with the store's `statement_hook` (which sees SQLite's BEGIN IMMEDIATE and every protocol statement, run on
the driver) and SQLAlchemy's ``before_cursor_execute`` (the effect's), plus the ``commit`` event (the COMMIT the
driver sends). The effect here issues no SQL, so
these are the protocol's own statements; the seed 000 debit adds its UPDATE and SELECT to a first-time request.
The numbers are documented in BENCHMARKS.md ("Statements per request"); a change here is a change in cost.

SQLite always; PostgreSQL and MariaDB/MySQL when the engine catalogue can provide a server (skipped with its reason
otherwise). SQL Server and Oracle without a server: the statements the backend compiles for a first-time request,
captured by a recording connection (the replay path needs a stored row from a live server, so it is skipped).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from async_common import async_store_class
from idem_dialects_bench import Recorder, record_statements, statement_kind
from sqlalchemy import create_engine, event
from sqlalchemy.pool.base import ResetStyle

from idem_dialects import IdempotencyStore, dialects, engines
from idem_dialects.dialects.mysql import MySQLBackend, _reset_unless_clean, resets_by_hook
from idem_dialects.outcomes import Claimed
from idem_dialects.steps import Begin

# backend -> path -> (statement kinds in order, commits). Transaction control the driver sends outside a cursor
# (psycopg's BEGIN) is not in the list: it is one more round trip per transaction on PostgreSQL.
EXPECTED: dict[str, dict[str, tuple[list[str], int]]] = {
    "sqlite": {
        # `run` begins deferred and reads first: a replay takes no write lock; a first-time request restarts as
        # BEGIN IMMEDIATE once the read found nothing (in-process statements, no round trips).
        "first": (["BEGIN", "SELECT", "ROLLBACK", "BEGIN IMMEDIATE", "INSERT", "UPDATE"], 1),
        "replay": (["BEGIN", "SELECT"], 1),
    },
    "postgresql": {
        # The claim is one statement that inserts or returns the committed winner (WITH ins AS (INSERT ...)
        # ... UNION ALL SELECT ...); a separate SELECT follows only when the winner committed after its snapshot.
        "first": (["WITH", "UPDATE"], 1),
        "replay": (["WITH"], 1),
    },
    "mariadb": {
        # The claim is INSERT ... ON DUPLICATE KEY UPDATE <key> = <key> RETURNING <winner>: it inserts or returns
        # the committed winner, without an error and without a second statement. The pool sends no reset ROLLBACK
        # after the store's COMMIT (test_pool_reset_rolls_back_only_what_is_open counts it).
        "first": (["INSERT", "UPDATE"], 1),
        "replay": (["INSERT"], 1),
    },
    "mysql": {
        # No RETURNING on MySQL: the duplicate INSERT fails (1062; the primary key is the record table's only unique
        # key, so it is the claim's own duplicate) and the locking read of the winner follows.
        "first": (["INSERT", "UPDATE"], 1),
        "replay": (["INSERT", "SELECT"], 1),
    },
    # Compiled without a server (first-time path only).
    "mssql": {"first": (["DECLARE", "UPDATE"], 1)},
    "oracle": {"first": (["INSERT", "UPDATE"], 1)},
}

LIVE = {"sqlite": "sqlite", "postgresql": "postgresql", "postgresql-18": "postgresql-18", "mariadb": "mariadb",
        "mysql": "mysql-8.4"}


def _no_sql(conn: Any) -> dict[str, int]:
    return {"balance": 900}


RECORDERS: dict[str, Recorder] = {}  # by table prefix: each store's statement_hook


@pytest.fixture(scope="module", params=sorted(LIVE))
def live_store(request: pytest.FixtureRequest) -> Iterator[IdempotencyStore]:
    spec = engines.get(LIVE[request.param])
    try:
        server = spec.provide()
    except engines.Unavailable as exc:
        pytest.skip(f"{spec.name}: {exc}")
    prefix = f"sc_{uuid.uuid4().hex[:6]}_"
    RECORDERS[prefix] = recorder = Recorder()
    try:
        store = IdempotencyStore.from_url(server.url, table_prefix=prefix, statement_hook=recorder)
    except ImportError as exc:
        server.stop()
        pytest.skip(f"{spec.name}: driver or backend not importable: {exc}")
    store.create_tables()
    yield store
    store.drop_tables()
    store.engine.dispose()
    server.stop()


def _counted(store: IdempotencyStore, fn: Callable[[], object]) -> tuple[list[str], int]:
    with record_statements(store.engine, RECORDERS[store.table_prefix]) as log:
        fn()
    return log.kinds, log.commits


def test_first_time_and_replay(live_store: IdempotencyStore) -> None:
    store = live_store
    expected = EXPECTED[store.backend.name]
    key = uuid.uuid4().hex
    call = lambda: store.run(scope="account:1", operation="debit:v1", key=key,  # noqa: E731
                             request={"amount": 100}, effect=_no_sql)
    # Warm the connection first: per-connection setup (e.g. MariaDB's sql_mode check) is not per-request cost.
    store.run(scope="account:1", operation="debit:v1", key="warm", request={}, effect=_no_sql)
    assert _counted(store, call) == expected["first"]
    assert _counted(store, call) == expected["replay"]


def test_async_store_sends_the_same_statements(live_store: IdempotencyStore) -> None:
    """AsyncIdempotencyStore runs the same protocol through SQLAlchemy's greenlet bridge, so each path sends the
    same statements as the sync store (the SQLite replay too: deferred, no write lock)."""
    expected = EXPECTED[live_store.backend.name]
    url = live_store.engine.url
    driver = dialects.async_drivers(type(live_store.backend))[0]
    AsyncIdempotencyStore = async_store_class(driver)
    url = url.set(drivername=f"{url.get_backend_name()}+{driver}")

    async def no_sql(conn: Any) -> dict[str, int]:
        return {"balance": 900}

    async def paths() -> list[tuple[list[str], int]]:
        recorder = Recorder()
        async with AsyncIdempotencyStore.from_url(url, table_prefix=live_store.table_prefix,
                                                  statement_hook=recorder) as store:
            key, counted = uuid.uuid4().hex, []
            await store.run(scope="account:1", operation="debit:v1", key="async-warm", request={}, effect=no_sql)
            for _ in ("first", "replay"):
                with record_statements(store.engine.sync_engine, recorder) as log:
                    await store.run(scope="account:1", operation="debit:v1", key=key, request={"amount": 100},
                                    effect=no_sql)
                counted.append((log.kinds, log.commits))
            return counted

    assert asyncio.run(paths()) == [expected["first"], expected["replay"]]


def test_debit_effect_adds_two_statements(tmp_path: Any) -> None:
    """The bench's first-time request: the protocol's statements plus the debit's UPDATE and SELECT."""
    from idem_dialects_bench import Workload

    RECORDERS["sc_"] = recorder = Recorder()
    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'c.db'}", table_prefix="sc_", statement_hook=recorder)
    work = Workload(store)
    work.create([1], plpgsql=False)
    try:
        assert _counted(store, lambda: work.bare(1, "")) == (["BEGIN IMMEDIATE", "UPDATE", "SELECT"], 1)
        assert _counted(store, lambda: work.via_run(1, "k")) == (
            ["BEGIN", "SELECT", "ROLLBACK", "BEGIN IMMEDIATE", "INSERT", "UPDATE", "SELECT", "UPDATE"], 1)
        assert _counted(store, lambda: work.via_run(1, "k")) == (["BEGIN", "SELECT"], 1)
    finally:
        work.drop()
        store.engine.dispose()


# --- without a server: what the backend compiles -------------------------------------------------------------


class _Result:
    rowcount = 1

    def scalar_one(self) -> int:
        return 1

    def scalar(self) -> int:
        return 1

    def first(self) -> tuple[int]:
        return (1,)

    def close(self) -> None:
        pass


class RecordingConnection:
    """Stands in for a Connection: compiles each statement for the engine's dialect and records it; every
    statement "succeeds" as on a first-time request (the insert inserts, the fenced update matches one row)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.dialect = engine.dialect
        self.connection = SimpleNamespace(dbapi_connection=None)  # no driver connection behind it
        self.info: dict[str, Any] = {}
        self.statements: list[str] = []
        self.commits = 0

    def execute(self, statement: Any, parameters: Any = None) -> _Result:
        self.statements.append(str(statement.compile(dialect=self.dialect)))
        return _Result()

    def exec_driver_sql(self, statement: str, parameters: Any = None) -> _Result:
        self.statements.append(statement)
        return _Result()

    def get_execution_options(self) -> dict[str, Any]:
        return {}

    @contextmanager
    def begin(self) -> Iterator[None]:
        yield
        self.commits += 1

    @contextmanager
    def begin_nested(self) -> Iterator[None]:
        self.statements.append("SAVEPOINT")
        yield
        self.statements.append("RELEASE SAVEPOINT")


@pytest.mark.parametrize("backend,url", [("mssql", "mssql+pyodbc://u:p@localhost/db?driver=FreeTDS"),
                                         ("oracle", "oracle+oracledb://u:p@localhost/?service_name=FREEPDB1")])
def test_first_time_compiled_without_server(backend: str, url: str) -> None:
    try:
        engine = create_engine(url)
        store = IdempotencyStore(engine, table_prefix="sc_")
    except ImportError as exc:
        pytest.skip(f"{backend}: driver or backend not importable: {exc}")
    # The store reads server-decided features once, on its first connection: not part of any request's count.
    store.claim(RecordingConnection(engine), scope="account:1", operation="debit:v1", key="warm",  # type: ignore
                request={})
    conn = RecordingConnection(engine)
    with store.backend.transaction(conn, Begin.STORE):  # type: ignore[arg-type]
        store.drive(store.backend.begin(Begin.STORE), conn)  # type: ignore[arg-type]
        outcome = store.claim(conn, scope="account:1", operation="debit:v1", key="k",  # type: ignore[arg-type]
                              request={"amount": 100})
        assert isinstance(outcome, Claimed)
        store.complete(conn, outcome, {"balance": 900})  # type: ignore[arg-type]
    assert ([statement_kind(s) for s in conn.statements], conn.commits) == EXPECTED[backend]["first"]


@pytest.mark.parametrize("backend", ["mssql", "oracle"])
def test_replay_needs_a_server(backend: str) -> None:
    pytest.skip(f"{backend}: the replay path reads the stored record back, which needs a live server"
                f" (set {engines.env_var(backend + '-2022' if backend == 'mssql' else backend + '-23')})")


# --- MySQL/MariaDB: the pool's reset ROLLBACK only when a transaction may be open -----------------------------------


@pytest.mark.parametrize("name", ["mariadb", "mysql-8.4"])
def test_pool_reset_rolls_back_only_what_is_open(name: str) -> None:
    """A store built by from_url returns its connections after its own COMMIT without the pool's ROLLBACK (counted
    by the server: Com_rollback of the one pooled session), while a connection application code returns
    mid-transaction, through a Connection or as a raw DBAPI connection, is still rolled back: its row is never
    committed, not even by the next transaction on the same session."""
    spec = engines.get(name)
    try:
        server = spec.provide()
    except engines.Unavailable as exc:
        pytest.skip(f"{spec.name}: {exc}")
    store = IdempotencyStore.from_url(server.url, table_prefix=f"sc_{uuid.uuid4().hex[:6]}_", pool_size=1,
                                      max_overflow=0)
    app = f"{store.table_prefix}app"
    other = create_engine(store.engine.url)
    try:
        store.create_tables()
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {app} (id INT PRIMARY KEY) ENGINE=InnoDB")

        def rollbacks() -> int:
            with store.transaction() as conn:  # the one pooled session
                return int(conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Com_rollback'").one()[1])

        call = lambda: store.run(scope="s", operation="op", key="k", request={}, effect=_no_sql)  # noqa: E731
        call()
        before = rollbacks()
        call(), call()  # two replays
        assert rollbacks() == before  # no ROLLBACK on the session: nothing was open when the store returned it

        conn = store.engine.connect()
        conn.exec_driver_sql(f"INSERT INTO {app} VALUES (1)")
        conn.close()  # mid-transaction: the Connection rolls back its own transaction
        raw = store.engine.raw_connection()
        raw.cursor().execute(f"INSERT INTO {app} VALUES (2)")
        raw.close()  # mid-transaction, under the Connection's radar: the pool's reset hook must roll back
        assert rollbacks() == before + 2
        call()  # the next transaction on the same session commits only its own work
        with other.connect() as check:
            assert check.exec_driver_sql(f"SELECT COUNT(*) FROM {app}").scalar_one() == 0
    finally:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {app}")
        store.drop_tables()
        store.close()
        other.dispose()
        server.stop()


def test_reset_hook_only_where_the_pool_resets_nothing() -> None:
    """SQLAlchemy has no public accessor for a pool's reset style, so MySQLBackend reads Pool._reset_on_return to
    install its reset hook only on an engine built with pool_reset_on_return=None (what from_url asks for). This
    fails loudly if the private attribute moves: the hook would silently vanish, and with it every reset."""
    quiet = create_engine("mysql+pymysql://u@127.0.0.1/d", pool_reset_on_return=None)
    default = create_engine("mysql+pymysql://u@127.0.0.1/d")
    try:
        assert quiet.pool._reset_on_return is ResetStyle.reset_none
        assert default.pool._reset_on_return is ResetStyle.reset_rollback
        assert resets_by_hook(quiet.pool) and not resets_by_hook(default.pool)
        MySQLBackend(quiet), MySQLBackend(default)
        assert event.contains(quiet.pool, "reset", _reset_unless_clean)
        assert not event.contains(default.pool, "reset", _reset_unless_clean)  # its own ROLLBACK is enough
    finally:
        quiet.dispose()
        default.dispose()


@pytest.mark.parametrize("driver", ["pymysql", "asyncmy"])
def test_mariadb_server_counts_one_commit_per_transaction(driver: str) -> None:
    """The server's own count (the session's Com_commit): one COMMIT per transaction, first-time and replay, sync and
    async. asyncmy's commit() sends COMMIT whatever the state: the store leaves it to SQLAlchemy's commit alone."""
    spec = engines.get("mariadb")
    try:
        server = spec.provide()
    except engines.Unavailable as exc:
        pytest.skip(f"{spec.name}: {exc}")
    pytest.importorskip(driver, reason=f"{driver} is not installed (pip install 'idem-dialects[{driver}]')")
    url = server.url.set(drivername=f"mariadb+{driver}")
    prefix = f"sc_{uuid.uuid4().hex[:6]}_"
    count = "SHOW SESSION STATUS LIKE 'Com_commit'"

    async def effect(conn: Any) -> dict[str, int]:
        return {"balance": 900}

    async def commits_async() -> list[int]:
        from sqlalchemy import text

        from idem_dialects import AsyncIdempotencyStore

        async with AsyncIdempotencyStore.from_url(url, table_prefix=prefix, pool_size=1, max_overflow=0) as store:
            await store.create_tables()
            try:
                seen = []
                for key in ("warm", "k", "k"):  # the same pooled connection each time: its session's count
                    async with store.engine.connect() as conn:
                        before = int((await conn.execute(text(count))).one()[1])
                    await store.run(scope="s", operation="op", key=key, request={}, effect=effect)
                    async with store.engine.connect() as conn:
                        seen.append(int((await conn.execute(text(count))).one()[1]) - before)
                return seen[1:]
            finally:
                await store.drop_tables()

    def commits_sync() -> list[int]:
        with IdempotencyStore.from_url(url, table_prefix=prefix, pool_size=1, max_overflow=0) as store:
            store.create_tables()
            try:
                seen = []
                for key in ("warm", "k", "k"):
                    with store.engine.connect() as conn:
                        before = int(conn.exec_driver_sql(count).one()[1])
                    store.run(scope="s", operation="op", key=key, request={}, effect=lambda conn: {"balance": 900})
                    with store.engine.connect() as conn:
                        seen.append(int(conn.exec_driver_sql(count).one()[1]) - before)
                return seen[1:]
            finally:
                store.drop_tables()

    try:
        assert (asyncio.run(commits_async()) if driver == "asyncmy" else commits_sync()) == [1, 1]  # first, replay
    finally:
        server.stop()
