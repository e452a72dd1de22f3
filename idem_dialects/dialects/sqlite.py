"""SQLite: one writer at a time. Take the write lock when the transaction begins, absorb busy errors.

A deferred transaction (the sqlite3 default) that reads and then writes can fail with SQLITE_BUSY at once,
without waiting, when another connection wrote in between; BEGIN IMMEDIATE makes claimers queue on the lock
instead (within the busy timeout), and `run` retries what still comes back busy.

`run(..., on_in_flight="conflict")` answers in flight only for its own key: the lock is the database's, and a
writer's uncommitted claim is invisible to every other connection, so the backend notes the keys its write
transactions claim, per database file, in this process (`_Held`): `run`'s claim notes its key before it asks for the
write lock, so of two duplicates the second to ask knows of the first even if the first has not written yet. A claim
whose key such a transaction holds claims with a busy timeout of 0: it gets SQLITE_BUSY at once, answered in flight
(the connection's busy timeout is put back after the claim). Any other claim waits for the write lock as in wait
mode, then claims or replays: a writer with another key, or one in another process, which the backend cannot see.

`run`'s claim is the exception (`Begin.CLAIM`): its transaction begins deferred and the claim reads the record first,
so a replay takes no write lock (it runs beside a writer in WAL mode, and a read-only database still replays). When
the claim must write (no record yet, or a claim whose lease is over), nothing but that read ran, so the transaction
restarts as BEGIN IMMEDIATE and claims as usual; it never upgrades a read transaction to a write.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from datetime import datetime
from functools import partial
from pathlib import PurePath
from time import monotonic
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import DateTime, Engine, delete, func, literal_column, select, text, type_coerce
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table

from ..drivers import aiosqlite, pysqlite
from ..errors import IdemWarning
from ..features import Features
from ..steps import Begin, Flow, Shape, execute, rowcount
from .base import Backend, Columns, insert_values, params, set_during, statement
from .sqlite_errors import SQLiteErrors, is_read_only
from .sqlite_maintenance import SQLiteMaintenance
from .types import TextOrParsedDateTime

_TIME_FORMAT = "%Y-%m-%d %H:%M:%f"  # millisecond text that sorts as it compares, and SQLAlchemy parses
_RESTART = ("ROLLBACK", "BEGIN IMMEDIATE")  # a read-only claim transaction becoming a writer's
_BUSY_TIMEOUT = text("PRAGMA busy_timeout")
_SLICE_MS = 20  # how long a claim under `not_waiting` waits for the write lock before it looks for a duplicate again


class _Held:
    """The keys claimed by this process's write transactions not yet ended, per database file and table: a write
    transaction notes each key it claims (`SQLiteBackend.claim`) and lets them go when it ends (`transaction`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # A plain dict, not a Counter: every first-time request notes a key and lets it go, and Counter's methods
        # are Python calls (its subtract, __missing__, __delitem__).
        self._keys: dict[tuple[Any, ...], int] = {}

    def note(self, noted: list[tuple[Any, ...]], key: tuple[Any, ...]) -> bool:
        """Note `key` for the transaction whose list is `noted`; True if another transaction had noted it."""
        with self._lock:
            count = self._keys.get(key, 0)
            self._keys[key] = count + 1
        noted.append(key)
        return count > 0

    def let_go(self, noted: list[tuple[Any, ...]]) -> None:
        keys = self._keys
        with self._lock:
            for key in noted:
                count = keys[key] - 1
                if count > 0:
                    keys[key] = count
                else:
                    del keys[key]

    def __contains__(self, key: tuple[Any, ...]) -> bool:
        return key in self._keys

    def noted(self, key: tuple[Any, ...]) -> int:
        """How many transactions noted `key`."""
        return self._keys.get(key, 0)


_HELD = _Held()
S = TypeVar("S")
# The keys the current transaction (of this thread, or task: the async store's greenlets share its context) noted.
_NOTED: ContextVar[list[tuple[Any, ...]] | None] = ContextVar("idem_dialects_sqlite_noted", default=None)
# Set by `not_waiting` around a claim that must not wait for a duplicate noted while it read.
_NOT_WAITING: ContextVar[bool] = ContextVar("idem_dialects_sqlite_not_waiting", default=False)


def is_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"


SQLITE_MAX_LENGTH = 1_000_000_000  # SQLite's default (sqlite3 and aiosqlite bind bytes as a BLOB, as they are)


class SQLiteBackend(Backend):
    name = "sqlite"
    drivers = (pysqlite.DRIVER, aiosqlite.DRIVER)
    classifier = SQLiteErrors
    maintainer = SQLiteMaintenance
    aliases = ("sqlite3",)
    # SQLite transactions are serializable; that is the only level it has. One write lock per database. A string or
    # BLOB holds at most SQLITE_MAX_LENGTH bytes (compiled in; "string or blob too big" beyond, a DataError).
    base_features = Features(isolation_levels=("SERIALIZABLE",), writers=1, max_statement_bytes=SQLITE_MAX_LENGTH,
                             statement_limit=f"SQLite's SQLITE_MAX_LENGTH, {SQLITE_MAX_LENGTH:,} bytes per value")
    columns = Columns(timestamp=TextOrParsedDateTime())

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        url: URL | None = getattr(engine, "url", None)  # None: a mock engine (DDL without a database)
        self.memory = url is not None and is_memory(url)
        # What tells this database file from another in `_HELD` (a :memory: database is its engine's own).
        self._database: object = id(engine) if self.memory or url is None else os.path.realpath(url.database or "")
        # A :memory: database is one connection (StaticPool); transactions on it must take turns.
        self._memory_lock = threading.RLock() if self.memory else None
        if self.memory and url is not None and not isinstance(engine.pool, StaticPool):
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
    def existing_database_url(cls, url: URL) -> URL:
        # sqlite3 creates a missing file on connect, unless opened by URI in read-write mode.
        if is_memory(url) or url.query.get("uri") or not url.database:
            return url
        return url.set(database=f"file:{quote(url.database)}", query={**url.query, "mode": "rw", "uri": "true"})

    @classmethod
    def url_features(cls, url: URL) -> Features:
        if is_memory(url):  # one shared connection whose transactions take turns, in this process only
            return cls.base_features.replace(concurrent_connections=False, processes=False)
        return cls.base_features

    def session_setup(self, dbapi_connection: Any) -> None:
        # WAL lets readers run beside the one writer; it is a property of the file, so setting it again is free. It
        # switches only outside a transaction: a connection lent inside one (Django's) keeps the mode it has.
        if self.memory or getattr(dbapi_connection, "in_transaction", False):
            return
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
        except Exception as exc:  # a read-only database cannot switch: its first write says so
            if not is_read_only(exc):
                raise
        finally:
            cursor.close()

    # --- transactions and the clock --------------------------------------------------------------------------

    @contextmanager
    def transaction(self, conn: Connection, begin: Begin) -> Iterator[None]:
        # `begin`'s BEGIN is the transaction's first statement, so sqlite3's own (deferred) BEGIN, which its legacy
        # transaction control sends before an INSERT, UPDATE or DELETE outside a transaction, never runs here: the
        # connection's isolation_level is left as the user set it (on aiosqlite a change would cost a hop each way).
        lock = self._memory_lock if self._memory_lock is not None else nullcontext()
        with lock:
            noted: list[tuple[Any, ...]] = []
            token = _NOTED.set(noted)
            try:
                with conn.begin():
                    yield
            finally:
                if noted:
                    _HELD.let_go(noted)  # committed or rolled back: no longer in flight
                try:  # not suppress(): three calls more per transaction
                    _NOTED.reset(token)
                except ValueError:  # the async store ends a transaction in another greenlet of its task
                    pass

    def begin(self, begin: Begin) -> Flow[None]:
        verb = "BEGIN" if begin is Begin.CLAIM else "BEGIN IMMEDIATE"
        yield from execute(self.prepared(verb, partial(statement, text(verb), Shape.NOTHING)))

    def db_namespace(self) -> str | None:
        """The database file's name, not its path: where the service keeps its files is not telemetry's business."""
        name = super().db_namespace()
        return PurePath(name).name or None if name is not None else None

    def autocommit_setting(self, conn: Connection) -> str | None:
        dbapi: Any = conn.connection.dbapi_connection
        if dbapi is None:
            return None
        if getattr(dbapi, "autocommit", None) is True:  # Python 3.12+: commit() and rollback() then do nothing
            return f"{conn.dialect.driver}'s autocommit=True"
        level = dbapi.isolation_level
        # A caller who began explicitly (Django's atomic() issues BEGIN under isolation_level=None) is in a
        # transaction: the store's statements join it. aiosqlite's adapter does not say; its connection does.
        raw = getattr(dbapi, "_connection", dbapi)
        began = getattr(dbapi, "in_transaction", None) or getattr(raw, "in_transaction", False)
        if level is not None or began:
            return None
        return f"{conn.dialect.driver}'s connect_args={dict(pysqlite.AUTOCOMMIT)!r}"

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        if seconds == 0:
            expr = func.strftime(_TIME_FORMAT, "now")
        else:
            expr = func.strftime(_TIME_FORMAT, "now", f"{seconds:+.3f} seconds")
        return type_coerce(expr, DateTime())

    # --- the protocol's statements ---------------------------------------------------------------------------

    def claim(self, table: Table, values: Mapping[str, Any], clock: Mapping[str, float], key: Mapping[str, str],
              fresh: bool) -> Flow[tuple[bool, Any]]:
        if fresh:  # the first statement of a deferred transaction
            row = yield from self.read(table, key)
            # Replayed, mismatched or in flight under a live lease: answered without writing.
            if row is not None and (row.completed_at is not None or row.locked_until > row.db_now):
                return False, row
            # Only the read ran: restart as a writer rather than upgrade. The key is noted first, so a duplicate
            # asking for the lock meanwhile knows it is in flight; and if one had noted it, under `not_waiting` this
            # one does not wait for the lock either.
            noted = _NOTED.get()
            held = self._held_key(table, key)
            duplicate = noted is not None and _HELD.note(noted, held)
            if not _NOT_WAITING.get():
                yield from self._restart()
            elif duplicate:  # the one that noted it first claims it, or holds it already: do not wait for it
                yield from self._busy_timeout(0, lambda _: self._restart())
            else:  # another key's writer may hold the lock: wait for it, unless a duplicate noted since takes it
                yield from self._busy_timeout(_SLICE_MS, lambda ms: self._restart(held, monotonic() + ms / 1000))
        inserted, row = yield from super().claim(table, values, clock, key, fresh=False)
        if inserted and not fresh:  # a claim that did not restart above notes its key once it holds it
            noted = _NOTED.get()
            if noted is not None:
                held = self._held_key(table, key)
                if held not in noted:
                    _HELD.note(noted, held)
        return inserted, row

    def _restart(self, held: tuple[Any, ...] | None = None, deadline: float = 0.0) -> Flow[None]:
        """ROLLBACK, BEGIN IMMEDIATE. With `held` (the key, noted by this transaction), the lock is asked for in
        slices of the busy timeout until `deadline`; busy after a slice in which another transaction noted the key
        too, it stops waiting (busy: answered in flight)."""
        rollback = self.prepared(_RESTART[0], partial(statement, text(_RESTART[0]), Shape.NOTHING))
        begin = self.prepared(_RESTART[1], partial(statement, text(_RESTART[1]), Shape.NOTHING))
        yield from execute(rollback)
        while True:
            try:
                yield from execute(begin)
                return
            except DBAPIError as exc:
                if held is None or not self.errors.is_lock_busy(exc) or _HELD.noted(held) > 1 \
                        or monotonic() >= deadline:
                    raise

    def _held_key(self, table: Table, key: Mapping[str, str]) -> tuple[Any, ...]:
        return (self._database, table.name, *sorted(key.items()))

    def insert_if_absent(self, table: Table, values: Mapping[str, Any],
                         clock: Mapping[str, float] | None = None) -> Flow[bool]:
        pk = [c.name for c in table.primary_key.columns]
        stmt = self.prepared(("insert", table, tuple(values), tuple(sorted((clock or {}).items()))), lambda: (
            statement(sqlite_insert(table).values(**insert_values(self, table, values, clock))
                           .on_conflict_do_nothing(index_elements=pk), Shape.ROWCOUNT, table)))
        return (yield from rowcount(stmt, params(values))) == 1

    def not_waiting(self, table: Table, key: Mapping[str, str], claim: Flow[Any]) -> Flow[Any]:
        if self._held_key(table, key) in _HELD:
            return (yield from self._busy_timeout(0, lambda _: claim))
        # The write lock, if taken, is another key's: wait for it, unless a duplicate notes the key meanwhile.
        token = _NOT_WAITING.set(True)
        try:
            return (yield from claim)
        finally:
            try:
                _NOT_WAITING.reset(token)
            except ValueError:  # the async store may end the flow in another greenlet of its task
                pass

    def _busy_timeout(self, ms: int, flow: Callable[[int], Flow[S]]) -> Flow[S]:
        """`flow(previous)` run with the connection's busy timeout at `ms` (`previous`: its own, put back after)."""
        previous = int((yield from execute(self.prepared("busy timeout", lambda: statement(
            _BUSY_TIMEOUT, Shape.ROW))))[0])

        def busy_timeout(ms: int) -> Flow[None]:  # an int: nothing to escape
            yield from execute(statement(text(f"PRAGMA busy_timeout = {ms}"), Shape.NOTHING))

        return (yield from set_during(busy_timeout, ms, previous, flow(previous)))

    def purge_batch(self, table: Table, condition: ColumnElement[bool], limit: int,
                    values: Mapping[str, Any] | None = None) -> Flow[int]:
        def build() -> Any:
            rowid: ColumnElement[int] = literal_column("rowid")
            batch = select(rowid).select_from(table).where(condition).limit(limit).scalar_subquery()
            return statement(delete(table).where(rowid.in_(batch)), Shape.ROWCOUNT, table)

        return (yield from rowcount(self.prepared(("purge", table, condition, limit), build), values))
