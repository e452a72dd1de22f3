"""SQLite: one writer at a time. Take the write lock when the transaction begins, absorb busy errors.

A deferred transaction (the sqlite3 default) that reads and then writes can fail with SQLITE_BUSY at once,
without waiting, when another connection wrote in between; BEGIN IMMEDIATE makes claimers queue on the lock
instead (within the busy timeout), and `run` retries what still comes back busy.

`run(..., on_in_flight="conflict")` claims with a busy timeout of 0: a claim that would queue on the write lock
(another transaction is writing: the first request of its key, or any other writer, since the lock is the database's)
gets SQLITE_BUSY at once, answered in flight; the connection's busy timeout is put back after the claim.

`run`'s claim is the exception (`claim_transaction`): it begins deferred and reads the record first, so a replay
takes no write lock (it runs beside a writer in WAL mode, and a read-only database still replays). When the claim
must write (no record yet, or a claim whose lease is over), nothing but that read ran, so the transaction restarts
as BEGIN IMMEDIATE and claims as usual; it never upgrades a read transaction to a write.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext, suppress
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Engine, delete, event, func, literal_column, select, text, type_coerce
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection, ExceptionContext
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table
from sqlalchemy.types import TypeEngine

from ..errors import ConnectionConfigError, IdemError, IdemWarning, RetryCause
from ..features import Features
from ..guard import MISSING_TABLE, NO_PRIVILEGE
from .base import AnyRow, Backend
from .drivers import Driver
from .types import TextOrParsedDateTime

# Primary result codes (the low byte of the extended code sqlite3 exposes as sqlite_errorcode).
_SQLITE_ERROR = 1  # the generic code: a missing table has no code of its own
_SQLITE_BUSY = 5
_SQLITE_READONLY = 8
_SQLITE_LOCKED = 6
_SQLITE_CANTOPEN = 14
# Extended constraint codes: only these two are duplicates; NOT NULL (1299), CHECK (275), FK (787) are not.
_SQLITE_CONSTRAINT_PRIMARYKEY = 1555
_SQLITE_CONSTRAINT_UNIQUE = 2067
# Set by claim_transaction in Connection.info: the claim reads before it takes the write lock.
_READ_FIRST = "idem_dialects.sqlite_read_first"
# Set by _begin in Connection.info: the user's isolation_level while ours (None) is in force for the transaction.
_USER_ISOLATION = "idem_dialects.sqlite_user_isolation"
_TIME_FORMAT = "%Y-%m-%d %H:%M:%f"  # millisecond text that sorts as it compares, and SQLAlchemy parses


def is_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"


class SQLiteBackend(Backend):
    name = "sqlite"
    aliases = ("sqlite3",)
    # sqlite3's (and so aiosqlite's) autocommit mode: no implicit BEGIN, every statement outside BEGIN commits alone.
    drivers = (Driver("pysqlite", "sqlite3", None, autocommit_args={"isolation_level": None}),
               Driver("aiosqlite", "aiosqlite", "idem-dialects[async]", sync=False, asynchronous=True,
                      autocommit_args={"isolation_level": None}))
    embedded = True
    # SQLite transactions are serializable; that is the only level it has.
    base_features = Features(isolation_levels=("SERIALIZABLE",), writers=1)  # one write lock per database

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        url: URL | None = getattr(engine, "url", None)  # None: a mock engine (DDL without a database)
        self.memory = url is not None and is_memory(url)
        # A :memory: database is one connection (StaticPool); transactions on it must take turns.
        self._memory_lock = threading.RLock() if self.memory else None
        if url is None:
            return
        if not self.memory:
            event.listen(engine, "connect", _use_wal)
        elif not isinstance(engine.pool, StaticPool):
            warnings.warn(
                "this :memory: SQLite engine gives each thread (or pooled connection) its own empty database, so"
                " idempotency records are not shared between them; use IdempotencyStore.from_url (one shared"
                " connection), poolclass=StaticPool, or a file database",
                IdemWarning,
                stacklevel=3,
            )

    @classmethod
    def engine_options(cls, url: URL, options: Mapping[str, Any]) -> dict[str, Any]:
        opts = dict(options)
        if is_memory(url) and "poolclass" not in opts:
            # Each pooled connection to :memory: would be a different, empty database: share one.
            opts["poolclass"] = StaticPool
            opts.setdefault("connect_args", {}).setdefault("check_same_thread", False)
        return opts

    @classmethod
    def url_features(cls, url: URL) -> Features:
        if is_memory(url):  # one shared connection whose transactions take turns, in this process only
            return cls.base_features.replace(concurrent_connections=False, processes=False)
        return cls.base_features

    def timestamp_type(self) -> TypeEngine[datetime]:
        return TextOrParsedDateTime()

    @contextmanager
    def transaction(self, conn: Connection) -> Iterator[None]:
        with self._begin(conn, "BEGIN IMMEDIATE"):
            yield

    @contextmanager
    def claim_transaction(self, conn: Connection) -> Iterator[None]:
        with self._begin(conn, "BEGIN"):
            conn.info[_READ_FIRST] = True
            try:
                yield
            finally:
                conn.info.pop(_READ_FIRST, None)

    @contextmanager
    def _begin(self, conn: Connection, begin: str) -> Iterator[None]:
        # The DB-API connection: sqlite3 itself, or SQLAlchemy's adapter of aiosqlite, which forwards isolation_level.
        dbapi = conn.connection.dbapi_connection
        lock = self._memory_lock if self._memory_lock is not None else nullcontext()
        with lock:
            # Turn off sqlite3's implicit (deferred) BEGIN for this transaction only, so ours is the one that runs.
            previous = dbapi.isolation_level  # type: ignore[union-attr]
            conn.info[_USER_ISOLATION] = previous
            try:
                # Inside the try: aiosqlite sets it in its thread, and a task cancelled meanwhile must still restore
                # it, or the pool would hand out a connection in autocommit mode.
                dbapi.isolation_level = None  # type: ignore[union-attr]
                with conn.begin():
                    conn.exec_driver_sql(begin)
                    yield
            finally:
                conn.info.pop(_USER_ISOLATION, None)
                if not conn.invalidated:  # a cancelled (async) statement closed the connection: nothing to restore
                    _restore_isolation(conn, dbapi, previous)

    def log_exposure(self) -> str | None:
        if self.engine.dialect.driver != "aiosqlite" or not logging.getLogger("aiosqlite").isEnabledFor(logging.DEBUG):
            return None
        return ("the 'aiosqlite' logger is at DEBUG: it records every statement with its parameters, so the store's"
                " claim tokens, request fingerprints and stored responses would appear in your logs; set"
                " logging.getLogger('aiosqlite').setLevel(logging.INFO) to keep them out")

    def autocommit_setting(self, conn: Connection) -> str | None:
        dbapi: Any = conn.connection.dbapi_connection
        if dbapi is None:
            return None
        if getattr(dbapi, "autocommit", None) is True:  # Python 3.12+: commit() and rollback() then do nothing
            return f"{conn.dialect.driver}'s autocommit=True"
        # Inside the store's own transaction (`_begin`) isolation_level is None by our doing: judge the user's.
        level = conn.info[_USER_ISOLATION] if _USER_ISOLATION in conn.info else dbapi.isolation_level
        # A caller who began explicitly (Django's atomic() issues BEGIN under isolation_level=None) is in a
        # transaction: the store's statements join it. aiosqlite's adapter does not say; its connection does.
        raw = getattr(dbapi, "_connection", dbapi)
        began = getattr(dbapi, "in_transaction", None) or getattr(raw, "in_transaction", False)
        return self.autocommit_name(conn.dialect.driver) if level is None and not began else None

    def claim_or_read(
        self, conn: Connection, table: Table, values: Mapping[str, Any], clock: Mapping[str, float],
        key: Mapping[str, str],
    ) -> tuple[bool, AnyRow | None]:
        if conn.info.pop(_READ_FIRST, False):  # the first statement of claim_transaction's deferred transaction
            row = self.read_row(conn, table, key)
            # Replayed, mismatched or in flight under a live lease: answered without writing.
            if row is not None and (row.completed_at is not None or row.locked_until > row.db_now):
                return False, row
            conn.exec_driver_sql("ROLLBACK")  # only the read ran: restart as a writer rather than upgrade
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        return super().claim_or_read(conn, table, values, clock, key)

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        if seconds == 0:
            expr = func.strftime(_TIME_FORMAT, "now")
        else:
            expr = func.strftime(_TIME_FORMAT, "now", f"{seconds:+.3f} seconds")
        return type_coerce(expr, DateTime())

    def insert_if_absent(
        self, conn: Connection, table: Table, values: Mapping[str, Any], clock: Mapping[str, float] | None = None
    ) -> bool:
        pk = [c.name for c in table.primary_key.columns]
        stmt = self.prepared_insert(
            table, values, clock, lambda v: sqlite_insert(table).values(**v).on_conflict_do_nothing(index_elements=pk))
        return conn.execute(stmt, self.params(values)).rowcount == 1

    def purge_batch(self, conn: Connection, table: Table, condition: ColumnElement[bool], limit: int) -> int:
        rowid: ColumnElement[int] = literal_column("rowid")
        batch = select(rowid).select_from(table).where(condition).limit(limit).scalar_subquery()
        return conn.execute(delete(table).where(rowid.in_(batch))).rowcount

    # --- operations ------------------------------------------------------------------------------------------

    def size_statement(self, table: Table) -> Executable:
        # The dbstat virtual table (in the sqlite3 of CPython's builds; where it is missing, stats says so), summed per
        # b-tree: the table's own (its rows) and its indexes' (the primary key's autoindex among them).
        return text(
            "SELECT sum(CASE WHEN d.name = :t THEN d.pgsize ELSE 0 END),"
            " sum(CASE WHEN d.name = :t THEN 0 ELSE d.pgsize END)"
            " FROM dbstat('main', 1) AS d JOIN sqlite_master AS m ON m.name = d.name WHERE m.tbl_name = :t"
        ).bindparams(t=table.name)

    def is_duplicate(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlite_errorcode", None) in (_SQLITE_CONSTRAINT_PRIMARYKEY, _SQLITE_CONSTRAINT_UNIQUE)

    @contextmanager
    def not_waiting(self, conn: Connection, table: Table, key: Mapping[str, str]) -> Iterator[None]:
        previous = int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one())
        conn.exec_driver_sql("PRAGMA busy_timeout = 0")
        try:
            yield
        finally:
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {previous}")  # an int read just now: nothing to escape

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlite_errorcode", 0) & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


    def config_problem(self, exc: DBAPIError, context: ExceptionContext, tables: Sequence[str]) -> str | None:
        code = getattr(exc.orig, "sqlite_errorcode", None)
        if code is not None and code & 0xFF == _SQLITE_READONLY:
            return NO_PRIVILEGE
        if code != _SQLITE_ERROR or context.connection is None:
            return None
        # SQLITE_ERROR is every kind of SQL error: ask the database whether the statement's tables exist.
        dbapi = context.connection.connection.dbapi_connection
        if not tables or dbapi is None:
            return None
        cursor = dbapi.cursor()
        try:
            marks = ",".join("?" * len(tables))
            cursor.execute(f"SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ({marks})",
                           list(tables))
            row: Any = cursor.fetchone()
            found = int(row[0])
        finally:
            cursor.close()
        return MISSING_TABLE if found < len(set(tables)) else None

    def connect_error(self, exc: BaseException) -> IdemError | None:
        # A file that cannot be opened (missing directory, no permission) stays so: no retry helps. aiosqlite
        # raises sqlite3's own error from its thread, so both drivers carry the code.
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        if getattr(orig, "sqlite_errorcode", None) == _SQLITE_CANTOPEN:
            return ConnectionConfigError(self.name, f"cannot open the database file {self.engine.url.database!r}",
                                         "check that its directory exists and is writable")
        return super().connect_error(exc)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        if isinstance(exc, DBAPIError):
            code = getattr(exc.orig, "sqlite_errorcode", None)
            if code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED):
                return RetryCause.BUSY
        return super().retry_cause(exc)


def _restore_isolation(conn: Connection, dbapi: Any, previous: str | None) -> None:
    """Give the connection back the user's isolation_level. If its driver connection died under a cancelled
    statement (aiosqlite: "no active connection") that fails: discard the connection instead (never pooled in
    autocommit mode), and let the error that ended the transaction, usually the cancellation, go on unchanged."""
    try:
        dbapi.isolation_level = previous
    except Exception:
        with suppress(Exception):
            conn.invalidate()


def _use_wal(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets readers run beside the one writer; it is a property of the file, so setting it again is free.
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
    except Exception as exc:  # a read-only database cannot switch: its first write says so (InsufficientPrivilege)
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF != _SQLITE_READONLY:
            raise
    finally:
        cursor.close()
