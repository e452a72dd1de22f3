"""The backend contract: what the protocol asks of one SQL engine, declared.

A backend subclasses `Backend`. **Required**: `name`, `drivers`, `classifier` (an `ErrorClassifier` subclass, in
`<engine>_errors.py`) and `now_plus`; a registered backend that misses one is refused when it loads
(tests/test_contract.py checks every registered backend). **Optional**: every other member, whose portable default
works on an engine that follows the SQL standard and PEP 249.

Statements are data: the statement members are flows (`steps.py`) that yield `Exec` steps, each one of the store's
`Statement`s with its parameters, and never touch a connection. The store's loops execute them on the driver; only
`transaction`, `autocommit_setting` and `session_setup` see a connection (SQLAlchemy's, or a DBAPI one).
Drivers' quirks live in their modules (`idem_dialects.drivers`), error codes in the classifier, test provisioning
and benchmark facts in the engine catalogue (`idem_dialects.engines`). Names describe capabilities, never engines.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from sqlalchemy import DateTime, Engine, LargeBinary, String, and_, bindparam, delete, event, or_, select, text
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import BindParameter, ColumnElement
from sqlalchemy.sql.schema import Column, Table
from sqlalchemy.types import TypeEngine

from ..drivers import Driver
from ..errors import IdemError
from ..features import Features
from ..keys import MAX_LENGTH
from ..steps import Begin, Flow, Shape, Statement, execute, rowcount
from . import options
from .classify import ErrorClassifier
from .maintenance import Maintenance
from .pooler import PreparedStatements

S = TypeVar("S")
# The members a backend must define (`dialects.load` refuses a class without them); the abstract methods too.
REQUIRED = ("name", "drivers", "classifier", "now_plus")
# Statement shapes are few (tables x operations x lease lengths); the bound only protects against odd callers.
_PREPARED_LIMIT = 512
_SAVEPOINT = "idem_insert"


@dataclass(frozen=True)
class Columns:
    """The column types of the record tables on one engine: identities that compare byte for byte whatever the
    collation, hex tokens, timestamps of the database's clock, stored responses of any size."""

    key: TypeEngine[str] = field(default_factory=lambda: String(MAX_LENGTH))
    token: TypeEngine[str] = field(default_factory=lambda: String(64))  # fingerprints (64) and claim tokens (32)
    timestamp: TypeEngine[datetime] = field(default_factory=DateTime)
    blob: TypeEngine[bytes] = field(default_factory=LargeBinary)
    table_options: Mapping[str, Any] = field(default_factory=dict)  # Table() keyword arguments (MySQL's ENGINE)
    named_primary_key: bool = True  # False where the engine names it itself (InnoDB's PRIMARY)


def configured_isolation(target: Connection | Engine) -> str | None:
    """The isolation level SQLAlchemy was told to use for `target` (an execution option, or
    create_engine(isolation_level=...)), upper-cased; None for the server's default. No round trip."""
    level = target.get_execution_options().get("isolation_level")
    if level is None:
        # create_engine(isolation_level=...) has no public accessor; tests/test_core.py fails loudly if this moves.
        level = getattr(target.dialect, "_on_connect_isolation_level", None)
    return level.upper() if isinstance(level, str) else None


def replay_columns(table: Table, key: Iterable[str]) -> list[Column[Any]]:
    """What a caller reads of the row it lost to: every column but the key (its own) and created_at. Fewer columns
    are less work per replay (PyMySQL, for one, parses each column's metadata on every query)."""
    return [c for c in table.c if c.name not in key and c.name != "created_at"]


def binds(table: Table, names: Iterable[str], prefix: str = "v_") -> dict[str, BindParameter[Any]]:
    """Bind parameters typed like the columns (so key encodings apply), named `prefix + column`."""
    return {name: bindparam(prefix + name, type_=table.c[name].type) for name in names}


def params(values: Mapping[str, Any], prefix: str = "v_") -> dict[str, Any]:
    """The execution parameters for `binds(table, values, prefix)`."""
    return {prefix + name: value for name, value in values.items()}


def key_is(table: Table, key: Iterable[str], prefix: str = "k_") -> list[ColumnElement[bool]]:
    """The WHERE clause of one row by its key columns, bound as `prefix + column`."""
    return [table.c[name] == bind for name, bind in binds(table, key, prefix).items()]


def statement(clause: Executable, shape: Shape, *tables: Table) -> Statement:
    """One of the store's statements on `tables`: what a statement member yields (see `steps.Exec`)."""
    return Statement(clause, shape, tuple(t.name for t in tables))


def insert_values(backend: Backend, table: Table, values: Mapping[str, Any],
                  clock: Mapping[str, float] | None) -> dict[str, Any]:
    """What an INSERT sets: bind parameters for `values`, the database clock (plus seconds) for `clock`."""
    return {**binds(table, values), **{name: backend.now_plus(s) for name, s in (clock or {}).items()}}


def set_during(setting: Callable[[int], Flow[None]], value: int, previous: int, flow: Flow[S]) -> Flow[S]:
    """`flow` run with a session setting (a lock or busy timeout) at `value`, the connection's own value `previous`
    set back after it, whatever the flow raised (`not_waiting` on engines whose setting outlives the transaction)."""
    yield from setting(value)
    try:
        result = yield from flow
    except GeneratorExit:
        raise
    except BaseException:
        yield from setting(previous)
        raise
    yield from setting(previous)
    return result


class Backend(ABC):
    """One SQL engine's way of doing the protocol's statements, and its facts."""

    name: ClassVar[str]
    """Required. The SQLAlchemy dialect name this backend is registered under."""
    drivers: ClassVar[tuple[Driver, ...]]
    """Required. The DBAPI drivers it works with (their modules in `idem_dialects.drivers`), the preferred one of
    each kind (sync, async) first."""
    classifier: ClassVar[type[ErrorClassifier]]
    """Required. How its drivers' errors are read."""
    base_features: ClassVar[Features] = Features()
    """What it offers before anything is known of the server; `url_features` and `refine_features` adjust it."""
    aliases: ClassVar[tuple[str, ...]] = ()
    """Other names people type for it as a URL scheme (a did-you-mean hint suggests the backend)."""
    url_options: ClassVar[frozenset[str]] = frozenset()
    """The URL query options (options.py) it consumes; the driver never sees them."""
    columns: ClassVar[Columns] = Columns()
    """Its column types for the record tables."""
    maintainer: ClassVar[type[Maintenance]] = Maintenance
    """Its maintenance part (generations, estimates), reached as `backend.maintenance`; the default has neither."""
    several_hosts: ClassVar[str | None] = None
    """How its URL names several hosts (a failover list), said to whoever wrote HOST1:PORT1,HOST2:PORT2 in the host
    part; None: it connects to one host."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # A mock engine (create_mock_engine: DDL without a server) has no URL: it gets the backend's base features.
        url: URL | None = getattr(engine, "url", None)
        if url is not None:
            options.check(url, self.url_options)
        self.features: Features = self.base_features if url is None else self.url_features(url)
        self.errors: ErrorClassifier = self.classifier(self)
        self.maintenance: Maintenance = self.maintainer(self)
        self._prepared: dict[Hashable, Any] = {}
        if isinstance(engine, Engine):
            _install(self, engine)

    # --- the URL and the engine ------------------------------------------------------------------------------

    @classmethod
    def resolve_url(cls, url: URL) -> URL:
        """The URL `from_url` builds the engine from: a backend may pick an installed driver for a bare URL."""
        return url

    @classmethod
    def engine_options(cls, url: URL, options: Mapping[str, Any]) -> dict[str, Any]:
        """create_engine options for `from_url`: the user's, plus what this engine needs to work at all."""
        return dict(options)

    @classmethod
    def existing_database_url(cls, url: URL) -> URL:
        """`url`, opening its database only if it exists: a command that reads or maintains a store (stats, purge)
        must not create one by connecting. Connecting to a server never creates its database."""
        return url

    @classmethod
    def url_features(cls, url: URL) -> Features:
        """What this backend offers for a database at `url`, known without connecting (the URL's options)."""
        return cls.base_features.replace(failover_window=options.failover_window(url, cls.url_options))

    def refine_features(self, features: Features) -> Flow[Features]:
        """`features` adjusted to what the live server decides: a flow, run once in a store's first transaction
        (SQLAlchemy's dialect has met the server by then)."""
        return features.replace(default_isolation=getattr(self.engine.dialect, "default_isolation_level", None))
        yield  # pragma: no cover - a flow that needs no statement

    def session_setup(self, dbapi_connection: Any) -> None:
        """Session settings the protocol needs, made once on every DBAPI connection before the store's first
        transaction on it (the caller ends the transaction a statement here may have begun). The default: none."""
        return None

    # --- transactions and the clock --------------------------------------------------------------------------

    def transaction(self, conn: Connection, begin: Begin) -> AbstractContextManager[Any]:
        """SQLAlchemy's transaction on `conn`, with what the engine needs around it (a driver setting for its
        duration, a flag a pool hook reads after the COMMIT); the statements that begin it are `begin`'s. Entered at
        once. The default is SQLAlchemy's transaction itself (a context manager that commits or rolls back): no
        generator around it, a dozen calls less per transaction."""
        return conn.begin()

    def begin(self, begin: Begin) -> Flow[None]:
        """The statements that begin a transaction the store opens, run as its other statements are (e.g. taking the
        write lock up front); `Begin.CLAIM` is a transaction whose first statement is `run`'s claim, which may begin
        more cheaply (see `claim`'s `fresh`). The default: none (the driver begins on the first statement)."""
        return
        yield  # pragma: no cover - a flow

    def autocommit_setting(self, conn: Connection) -> str | None:
        """The driver setting that has `conn`'s DB-API connection commit every statement alone (what the user must
        remove), or None. Read without a round trip: the driver's own attribute, else SQLAlchemy's dialect."""
        dbapi: Any = conn.connection.dbapi_connection
        if dbapi is None:  # a connection already closed or invalidated: nothing runs on it
            return None
        driver = next((d for d in self.drivers if d.name == conn.dialect.driver), None)
        on = driver.autocommit_on(dbapi) if driver is not None else None
        if on is None:
            detect = getattr(conn.dialect, "detect_autocommit_setting", None)  # not in every SQLAlchemy 2.0
            try:
                # Before SQLAlchemy knew, the PEP 249 attribute (a method on MySQL drivers, so never `True` there).
                on = detect(dbapi) if detect is not None else getattr(dbapi, "autocommit", None) is True
            except NotImplementedError:  # a dialect that cannot tell: nothing to refuse
                return None
        if not on:
            return None
        if driver is None or driver.autocommit_args is None:
            return f"{conn.dialect.driver}'s autocommit, set on the DB-API connection"
        return f"{driver.name}'s connect_args={dict(driver.autocommit_args)!r}"

    @abstractmethod
    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        """Required. The database's current time plus `seconds` (may be negative), in the timestamp columns'
        representation: leases and retention use the database's clock, never the application's."""

    def now(self) -> ColumnElement[datetime]:
        return self.now_plus(0.0)

    # --- the protocol's statements ---------------------------------------------------------------------------

    def prepared(self, key: Hashable, build: Callable[[], S]) -> S:
        """The statement for `key`, built on first use. Per-request data travels as bind parameters, so a request
        costs neither building a statement nor compiling it."""
        try:
            stmt: S = self._prepared[key]
        except KeyError:
            if len(self._prepared) >= _PREPARED_LIMIT:
                self._prepared.clear()
            stmt = self._prepared[key] = build()
        return stmt

    def insert_if_absent(self, table: Table, values: Mapping[str, Any],
                         clock: Mapping[str, float] | None = None) -> Flow[bool]:
        """Insert one row unless its primary key exists; True if this call inserted it. `values` are plain Python
        values; `clock` names the columns set to the database's current time plus that many seconds. Must be atomic
        against concurrent inserts of the same key, leave the caller's transaction usable on a duplicate, and let
        every other error (NOT NULL, CHECK, another unique index) propagate. The portable default catches the
        duplicate inside a savepoint."""
        stmt = self.prepared(("insert", table, tuple(values), tuple(sorted((clock or {}).items()))),
                             lambda: statement(table.insert().values(**insert_values(self, table, values, clock)),
                                                    Shape.NOTHING, table))
        savepoint, release, undo = self.prepared("savepoint", lambda: tuple(
            statement(text(f"{verb} {_SAVEPOINT}"), Shape.NOTHING)
            for verb in ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")))
        yield from execute(savepoint)
        try:
            yield from execute(stmt, params(values))
        except DBAPIError as exc:
            if not self.errors.is_duplicate(exc):
                raise
            yield from execute(undo)
            return False
        yield from execute(release)
        return True

    def claim(self, table: Table, values: Mapping[str, Any], clock: Mapping[str, float], key: Mapping[str, str],
              fresh: bool) -> Flow[tuple[bool, Any]]:
        """Insert the claim row unless its primary key `key` exists: (True, None) if this call inserted it, else
        (False, the committed winner, or None if it vanished). The winner row needs fingerprint, claim_token,
        locked_until, completed_at, status, response and db_now (as `read` gives them). `fresh`: the claim is the
        first statement of a transaction the store began with `Begin.CLAIM`. The portable default is
        `insert_if_absent` then `read`; an engine that can do both in one statement overrides this."""
        if (yield from self.insert_if_absent(table, values, clock)):
            return True, None
        return False, (yield from self.read(table, key))

    def read(self, table: Table, key: Mapping[str, str]) -> Flow[Any]:
        """Read the row with this primary key as last committed (or written by this transaction), with the
        database's clock as `db_now`. Engines whose snapshot would hide a committed winner override this."""
        stmt = self.prepared(("read", table, tuple(key)), lambda: statement(
            select(*replay_columns(table, key), self.now().label("db_now")).where(*key_is(table, key)), Shape.ROW,
            table))
        return (yield from execute(stmt, params(key, "k_")))

    def not_waiting(self, table: Table, key: Mapping[str, str], claim: Flow[S]) -> Flow[S]:
        """`claim` (the claim of `run(..., on_in_flight="conflict")`) run so that a statement inside it that would
        wait for another transaction's lock (its uncommitted claim of `key`) fails at once instead, or after the
        engine's shortest lock wait, with an error `ErrorClassifier.is_lock_busy` recognises; the connection's own
        setting is back afterwards. Each engine's own mechanism: a lock timeout, NOWAIT, a busy timeout of zero. A
        backend without one refuses the option, before its claim runs."""
        claim.close()
        raise IdemError(f"{self.name}: on_in_flight='conflict' is not supported on this backend (it has no way to"
                        " refuse a lock wait); use on_in_flight='wait' or a lease")
        yield  # pragma: no cover - a flow

    def lock_batch(self, table: Table, columns: Sequence[ColumnElement[Any]], condition: ColumnElement[bool],
                   order_by: Sequence[ColumnElement[Any]], limit: int) -> Flow[list[Any]]:
        """`columns` of at most `limit` rows matching `condition`, the first by `order_by`, each locked until this
        transaction ends, skipping (never waiting for) rows another transaction has locked: how several relays
        share the outbox without taking one command twice. Rows come back in any order. The portable default is
        ``SELECT ... ORDER BY ... LIMIT n FOR UPDATE SKIP LOCKED`` (PostgreSQL, MySQL 8, MariaDB 10.6+); an engine
        with another spelling, or a single writer (SQLite, whose write lock already keeps claimers apart, and on
        which SQLAlchemy renders no FOR UPDATE), overrides it or relies on that."""
        stmt = self.prepared(("lock batch", table, condition, limit), lambda: statement(
            select(*columns).where(condition).order_by(*order_by).limit(limit).with_for_update(skip_locked=True),
            Shape.ROWS, table))
        return list((yield from execute(stmt)))

    def purge_batch(self, table: Table, condition: ColumnElement[bool], limit: int,
                    values: Mapping[str, Any] | None = None) -> Flow[int]:
        """Delete at most `limit` rows matching `condition` (its bind parameters' `values`: a range's edges); return
        how many went. The portable default selects the keys first, then deletes exactly those (still under
        `condition`, so a row completed or re-claimed in between is left alone); engines that can, do it in one
        statement."""
        pk = list(table.primary_key.columns)
        found = self.prepared(("purge keys", table, condition, limit), lambda: statement(
            select(*pk).where(condition).limit(limit), Shape.ROWS, table))
        keys = yield from execute(found, values)
        if not keys:
            return 0
        match = or_(*(and_(*(col == value for col, value in zip(pk, row, strict=True))) for row in keys))
        return (yield from rowcount(statement(delete(table).where(match, condition), Shape.ROWCOUNT, table), values))

    # --- operations ------------------------------------------------------------------------------------------

    @property
    def db_system_name(self) -> str:
        """`db.system.name` in OpenTelemetry's conventions: the backend's name, where the two agree."""
        return self.name

    def db_namespace(self) -> str | None:
        """`db.namespace` in OpenTelemetry's conventions: the database the URL names, known without a round trip."""
        url: URL | None = getattr(self.engine, "url", None)
        return url.database if url is not None and url.database else None

    def migration_table(self, table: Table) -> None:
        """Make `table` declare for Alembic's autogenerate what this backend's DDL hooks do at create time (which
        autogenerate never runs). Most backends create exactly what the table declares: no-op."""
        return None


_installed: weakref.WeakSet[Engine] = weakref.WeakSet()
_SET_UP = "idem_dialects.session_setup"  # in a DBAPI connection's pool record: `session_setup` ran on it


def _install(backend: Backend, engine: Engine) -> None:
    """What a backend needs on every engine a store wraps (once per engine, however many stores share it): its
    driver's listeners, the URL options consumed, its driver's prepared statements turned off behind a transaction-mode
    pooler (declared or found: `pooler.py`), and its session setup on each DBAPI connection, pooled before the store
    existed or not."""
    if engine in _installed:
        return
    _installed.add(engine)
    driver = next((d for d in backend.drivers if d.name == engine.dialect.driver), None)
    if driver is not None:
        driver.install(engine)
    if backend.url_options:
        prepares = driver is not None and (
            type(driver).without_prepared_statements is not Driver.without_prepared_statements)
        statements = PreparedStatements(backend, driver, engine) if driver is not None and prepares else None

        def connect_params(cparams: dict[str, Any], record: Any) -> None:
            if statements is not None:
                statements.connect_params(cparams, record)

        options.install(engine, connect_params)
        if statements is not None:
            statements.install(engine)
    if type(backend).session_setup is not Backend.session_setup:
        @event.listens_for(engine, "checkout")
        def setup(dbapi_connection: Any, record: Any, proxy: Any) -> None:
            if not record.info.get(_SET_UP):
                backend.session_setup(dbapi_connection)
                # Outside any transaction of the store's: its first statement begins its own (Galera waits for
                # other nodes' commits at a transaction's first statement, which should be the claim).
                dbapi_connection.commit()
                record.info[_SET_UP] = True
