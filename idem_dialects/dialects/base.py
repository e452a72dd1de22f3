"""The backend contract: everything engine-specific the protocol needs, and portable defaults.

The store (engine-neutral) calls these hooks; a dialect module overrides the ones its engine gets wrong.
Names describe capabilities (insert if absent, read the committed winner), never engines.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar, TypeAlias, TypeVar

from sqlalchemy import DateTime, Engine, LargeBinary, Select, String, and_, bindparam, delete, or_, select
from sqlalchemy.engine import URL, Connection, ExceptionContext, Row
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.pool import Pool
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import BindParameter, ColumnElement
from sqlalchemy.sql.schema import Column, Table
from sqlalchemy.types import TypeEngine

from ..errors import CannotConnect, IdemError, IdemWarning, RetryCause, TransientError
from ..features import Features
from ..keys import MAX_LENGTH
from ..retention import TableSize
from . import options
from .drivers import Driver
from .network import socket_problem

# A result row of any shape (SQLAlchemy 2.1 types rows by the tuple of their column types).
AnyRow: TypeAlias = "Row[*tuple[Any, ...]]"

S = TypeVar("S")
# Statement shapes are few (tables x operations x lease lengths); the bound only protects against odd callers.
_PREPARED_LIMIT = 512


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


class Backend:
    """One SQL engine's way of doing the protocol's statements, and its facts. Subclasses set `name` and override
    hooks; everything the project knows of an engine is here or in its provisioning module (`provision`)."""

    name: ClassVar[str]
    # What this engine offers before anything is known of the server; `url_features` and `refine_features`
    # adjust it per database.
    base_features: ClassVar[Features] = Features()
    # Other names people type for this backend as a URL scheme (a did-you-mean hint suggests the backend).
    aliases: ClassVar[tuple[str, ...]] = ()
    # This project's extra that installs the default driver (None: the driver comes with Python).
    extra: ClassVar[str | None] = None
    # The DBAPI drivers this backend works with, the preferred one of each kind (sync, async) first.
    drivers: ClassVar[tuple[Driver, ...]] = ()
    # The names of `drivers` that AsyncIdempotencyStore can use (create_async_engine), preferred first; derived.
    async_drivers: ClassVar[tuple[str, ...]] = ()
    # The database lives in the client's process: there is no server to restart and no connection to cut.
    embedded: ClassVar[bool] = False
    # The URL query options (options.py) this backend consumes; the driver never sees them.
    url_options: ClassVar[frozenset[str]] = frozenset()
    # The benchmark's baseline written as a PL/pgSQL function (the same debit, once per key) runs on this engine.
    plpgsql_baseline: ClassVar[bool] = False
    # The client CPU (ms) a replay may cost at one worker, where the benchmark set a target for this engine.
    replay_cpu_target_ms: ClassVar[float | None] = None
    # Test provisioning ("module:Class", a `Provision` subclass): containers, private servers, the fault proxy's
    # wire protocol, how to end a session. Loaded only by the engine catalogue and the conformance suite.
    provision: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "async_drivers" not in cls.__dict__:
            cls.async_drivers = tuple(d.name for d in cls.drivers if d.asynchronous)

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # A mock engine (create_mock_engine: DDL without a server) has no URL: it gets the backend's base features.
        url: URL | None = getattr(engine, "url", None)
        if url is not None:
            options.check(url, self.url_options)
        self.features = self.base_features if url is None else self.url_features(url)
        self._refined = False
        self._prepared: dict[Hashable, Any] = {}
        self._budget_warned = False
        if isinstance(engine, Engine) and self.url_options:
            options.install(engine, self.connect_params)

    # --- drivers --------------------------------------------------------------------------------------------

    @classmethod
    def driver(cls, name: str) -> Driver | None:
        """The driver a URL names (``<backend>+<name>``), if this backend knows it."""
        return next((d for d in cls.drivers if d.name == name), None)

    @classmethod
    def usable_drivers(cls, asynchronous: bool = False) -> tuple[str, ...]:
        """The drivers of one kind that can be imported here (installed, their system libraries present)."""
        return tuple(d.name for d in cls.drivers
                     if (d.asynchronous if asynchronous else d.sync) and d.problem() is None)

    @classmethod
    def install_hint(cls, driver: str) -> str:
        """What to install for `driver`: its package (or this backend's extra), and any missing system library; then,
        where a library is missing, a driver of the same kind that pip alone installs (no system library)."""
        known = cls.driver(driver)
        if known is not None:
            hint = known.install_hint()
            if known.missing_libraries():
                alternative = next((d for d in cls.drivers if not d.libraries and d.package is not None
                                    and ((known.sync and d.sync) or (known.asynchronous and d.asynchronous))), None)
                if alternative is not None:
                    hint += (f"; or, with pip only: pip install '{alternative.package}' and use"
                             f" {cls.name}+{alternative.name}:// URLs")
            return hint
        if cls.extra is not None:
            return f"pip install 'idem-dialects[{cls.extra}]'"
        return f"install the Python driver for {cls.name}+{driver}"

    # --- engine construction -------------------------------------------------------------------------------

    @classmethod
    def resolve_url(cls, url: URL) -> URL:
        """The URL `from_url` builds the engine from: a backend may pick an installed driver for a bare URL."""
        return url

    @classmethod
    def engine_options(cls, url: URL, options: Mapping[str, Any]) -> dict[str, Any]:
        """create_engine options for `from_url`: the user's, plus what this engine needs to work at all."""
        return dict(options)

    # --- features ---------------------------------------------------------------------------------------------

    @classmethod
    def url_features(cls, url: URL) -> Features:
        """What this backend offers for a database at `url`, known without connecting (the URL's options)."""
        return cls.base_features.replace(failover_window=options.failover_window(url, cls.url_options))

    def connect_params(self, params: dict[str, Any]) -> None:
        """Adjust the driver's connect() keyword arguments to what the URL's options declare (e.g. a pooler)."""

    def check_retry_budget(self, total: float) -> None:
        """Warn once (IdemWarning) if a retry budget of `total` seconds is shorter than the failover window the
        database declares: its callers would get RetriesExhausted during every failover."""
        message = options.budget_warning(total, self.features.failover_window)
        if message is not None and not self._budget_warned:
            warnings.warn(message, IdemWarning, stacklevel=3)
            self._budget_warned = True

    def refine_features(self, conn: Connection, features: Features) -> Features:
        """`features` adjusted to what the live server decides (called once, on the store's first connection)."""
        # Set once SQLAlchemy has initialized the dialect on a first connection.
        return features.replace(default_isolation=getattr(conn.dialect, "default_isolation_level", None))

    def live_features(self, conn: Connection) -> Features:
        """The features, refined from the server on first use (a benign race: every thread computes the same)."""
        if not self._refined:
            self.features = self.refine_features(conn, self.features)
            self._refined = True
        return self.features

    # --- column types ----------------------------------------------------------------------------------------

    def key_type(self) -> TypeEngine[str]:
        """A type under which identities compare byte for byte, whatever the database's default collation."""
        return String(MAX_LENGTH)

    def token_type(self) -> TypeEngine[str]:
        """ASCII hex: fingerprints (64) and claim tokens (32)."""
        return String(64)

    def timestamp_type(self) -> TypeEngine[datetime]:
        return DateTime()

    def blob_type(self) -> TypeEngine[bytes]:
        return LargeBinary()

    def table_kwargs(self) -> dict[str, Any]:
        return {}

    def primary_key_name(self, name: str) -> str | None:
        """The name the tables' primary key constraints get (`name`), or None where the engine has no such name."""
        return name

    # --- connections ----------------------------------------------------------------------------------------

    @contextmanager
    def connect(self, engine: Engine) -> Iterator[Connection]:
        """A connection from `engine`. Failing to open one raises what `connect_error` makes of it: CannotConnect
        (no statement ran, so `run` retries it within its budget) or a ConnectionConfigError naming the fix."""
        try:
            conn = engine.connect()
        except Exception as exc:
            problem = self.connect_error(exc)
            if problem is None:
                raise
            raise problem from exc
        with conn:
            yield conn

    def connect_error(self, exc: BaseException) -> IdemError | None:
        """What a failure to open a connection means: CannotConnect (transient: refused, reset, too many
        connections, the server starting or stopping), ConnectionConfigError (no retry can fix it: wrong password,
        unknown user, database or host), or None (the error propagates as it is). `exc` is whatever opening the
        connection raised (sync `engine.connect()`, async `AsyncConnection.start()`): a DBAPIError, or a driver's
        own exception that SQLAlchemy did not wrap (asyncpg raises OSError and its own errors as they are).
        Classified by error class and code, never by message text. The portable default: a socket-level cause
        (below the driver), then an OperationalError nothing else classifies, is transient."""
        problem = socket_problem(self.name, exc)
        if problem is not None:
            return problem
        if isinstance(exc, OperationalError) or self.retry_cause(exc) is not None:
            return CannotConnect(self.name, exc)
        return None

    def autocommit_setting(self, conn: Connection) -> str | None:
        """The driver setting that has `conn`'s DB-API connection commit every statement alone (what the user must
        remove), or None. Read without a round trip; the portable default asks SQLAlchemy's dialect, which knows
        each driver's attribute (psycopg's `autocommit`, PyMySQL's server status, pyodbc's `autocommit`, ...)."""
        dbapi: Any = conn.connection.dbapi_connection
        if dbapi is None:  # a connection already closed or invalidated: nothing runs on it
            return None
        detect = getattr(conn.dialect, "detect_autocommit_setting", None)  # not in every SQLAlchemy 2.0
        try:
            # Before SQLAlchemy knew, the PEP 249 attribute (a method on MySQL drivers, so never `True` there).
            on = detect(dbapi) if detect is not None else getattr(dbapi, "autocommit", None) is True
        except NotImplementedError:  # a dialect that cannot tell: nothing to refuse
            return None
        return self.autocommit_name(conn.dialect.driver) if on else None

    def autocommit_name(self, driver: str) -> str:
        """How a user of `driver` most likely turned autocommit on, for the error that asks them to remove it."""
        known = self.driver(driver)
        if known is None or known.autocommit_args is None:
            return f"{driver}'s autocommit, set on the DB-API connection"
        return f"{driver}'s connect_args={dict(known.autocommit_args)!r}"

    def log_exposure(self) -> str | None:
        """What the driver's own logging, as configured now, would record of stored values (the store warns once
        per process, naming it), or None. SQLAlchemy's engine log is handled by the store for every driver."""
        return None

    # --- transactions and the clock --------------------------------------------------------------------------

    @contextmanager
    def transaction(self, conn: Connection) -> Iterator[None]:
        """Begin a transaction the way this engine needs for a claim (e.g. taking the write lock up front)."""
        with conn.begin():
            yield

    @contextmanager
    def claim_transaction(self, conn: Connection) -> Iterator[None]:
        """The transaction `run` claims in (the claim is its first statement): by default `transaction`. A backend
        may begin it more cheaply, e.g. without the write lock a replay does not need (see `claim_or_read`)."""
        with self.transaction(conn):
            yield

    def now(self) -> ColumnElement[datetime]:
        """The database's current time, in the same representation as the timestamp columns."""
        return self.now_plus(0.0)

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        """The database's current time plus `seconds` (may be negative): leases and retention use the DB clock."""
        raise NotImplementedError

    # --- statements built once ------------------------------------------------------------------------------

    def prepared(self, key: Hashable, build: Callable[[], S]) -> S:
        """The statement for `key`, built on first use. Per-request data travels as bind parameters, so a request
        costs neither building a statement nor its cache key, which dominated the client-side time per request."""
        try:
            stmt: S = self._prepared[key]
        except KeyError:
            if len(self._prepared) >= _PREPARED_LIMIT:
                self._prepared.clear()
            stmt = self._prepared[key] = build()
        return stmt

    @staticmethod
    def binds(table: Table, names: Iterable[str], prefix: str = "v_") -> dict[str, BindParameter[Any]]:
        """Bind parameters typed like the columns (so key encodings apply), named `prefix + column`."""
        return {name: bindparam(prefix + name, type_=table.c[name].type) for name in names}

    @staticmethod
    def params(values: Mapping[str, Any], prefix: str = "v_") -> dict[str, Any]:
        """The execution parameters for `binds(table, values, prefix)`."""
        return {prefix + name: value for name, value in values.items()}

    def insert_values(self, table: Table, values: Mapping[str, Any], clock: Mapping[str, float]) -> dict[str, Any]:
        """What an INSERT sets: bind parameters for `values`, the database clock (plus seconds) for `clock`."""
        return {**self.binds(table, values), **{name: self.now_plus(s) for name, s in clock.items()}}

    def prepared_insert(
        self,
        table: Table,
        values: Mapping[str, Any],
        clock: Mapping[str, float] | None,
        build: Callable[[dict[str, Any]], S],
    ) -> S:
        """The insert-if-absent statement for this table, columns and clock offsets, built once by
        `build(insert_values)`; execute it with `self.params(values)`."""
        clock = clock or {}
        shape = ("insert", table, tuple(values), tuple(sorted(clock.items())))
        return self.prepared(shape, lambda: build(self.insert_values(table, values, clock)))

    # --- the protocol's statements ---------------------------------------------------------------------------

    def insert_if_absent(
        self, conn: Connection, table: Table, values: Mapping[str, Any], clock: Mapping[str, float] | None = None
    ) -> bool:
        """Insert one row unless its primary key exists; True if this call inserted it.

        `values` are plain Python values; `clock` names the columns set to the database's current time plus that
        many seconds. Must be atomic against concurrent inserts of the same key, must leave the caller's
        transaction usable on a duplicate, and must let every other error (NOT NULL, CHECK, another unique index)
        propagate. The portable default catches the duplicate inside a savepoint.
        """
        stmt = self.prepared_insert(table, values, clock, lambda v: table.insert().values(**v))
        try:
            with conn.begin_nested():
                conn.execute(stmt, self.params(values))
        except IntegrityError as exc:
            if self.is_duplicate(exc):
                return False
            raise
        return True

    def claim_or_read(
        self, conn: Connection, table: Table, values: Mapping[str, Any], clock: Mapping[str, float],
        key: Mapping[str, str],
    ) -> tuple[bool, AnyRow | None]:
        """Insert the claim row unless its primary key `key` exists: (True, None) if this call inserted it, else
        (False, the committed winner, or None if it vanished). The winner row needs fingerprint, claim_token,
        locked_until, completed_at, status, response and db_now (as `read_row` gives them). The portable default is
        `insert_if_absent` then `read_row`; an engine that can do both in one statement overrides this."""
        if self.insert_if_absent(conn, table, values, clock):
            return True, None
        return False, self.read_row(conn, table, key)

    def read_row(self, conn: Connection, table: Table, key: Mapping[str, str]) -> AnyRow | None:
        """Read the row with this primary key as last committed (or written by this transaction), with the
        database's clock as `db_now`. Engines whose snapshot would hide a committed winner override this
        (or `read_statement`)."""
        stmt = self.prepared(("read", table, tuple(key)), lambda: self.read_statement(conn, table, key))
        return conn.execute(stmt, self.params(key, "k_")).first()

    def read_statement(self, conn: Connection, table: Table, key: Iterable[str]) -> Select[Any]:
        """SELECT the row and `db_now` by primary key, the key as bind parameters named k_<column>."""
        where = [table.c[name] == bind for name, bind in self.binds(table, key, "k_").items()]
        return select(*replay_columns(table, key), self.now().label("db_now")).where(*where)

    @contextmanager
    def not_waiting(self, conn: Connection, table: Table, key: Mapping[str, str]) -> Iterator[None]:
        """Around the claim of `run(..., on_in_flight="conflict")`: a statement inside that would wait for another
        transaction's lock (its uncommitted claim of `key` in `table`) fails at once instead, or after the engine's
        shortest lock wait, with an error `is_lock_busy` recognises; the connection's own setting is back after the
        block (or its transaction's end undoes it). Each engine's own mechanism: a lock timeout, NOWAIT, a busy
        timeout of zero. A backend without one refuses the option here, before its claim runs."""
        raise IdemError(f"{self.name}: on_in_flight='conflict' is not supported on this backend (it has no way to"
                        " refuse a lock wait); use on_in_flight='wait' or a lease")
        yield  # pragma: no cover - a generator for @contextmanager

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        """True if a statement under `not_waiting` failed because it would have waited for another's lock."""
        return False

    def purge_batch(self, conn: Connection, table: Table, condition: ColumnElement[bool], limit: int) -> int:
        """Delete at most `limit` rows matching `condition`; return how many went.

        The portable default selects the keys first, then deletes exactly those (still under `condition`, so a
        row completed or re-claimed in between is left alone).
        """
        pk = list(table.primary_key.columns)
        keys = conn.execute(select(*pk).where(condition).limit(limit)).all()
        if not keys:
            return 0
        match = or_(*(and_(*(col == value for col, value in zip(pk, row, strict=True))) for row in keys))
        return conn.execute(delete(table).where(match, condition)).rowcount

    # --- operations: telemetry and stats ---------------------------------------------------------------------

    @property
    def db_system_name(self) -> str:
        """This engine's `db.system.name` in OpenTelemetry's semantic conventions."""
        return self.name

    def db_namespace(self) -> str | None:
        """`db.namespace`: the database the URL names, known without a round trip (None if it names none)."""
        url: URL | None = getattr(self.engine, "url", None)
        return url.database if url is not None and url.database else None

    def size_statement(self, table: Table) -> Executable | None:
        """A statement giving one row (table bytes, index bytes) for `table` from the engine's catalog, or None if the
        engine reports no sizes. Table bytes include the table's LOB/TOAST storage; index bytes every index's."""
        return None

    def table_size(self, conn: Connection, table: Table) -> TableSize | None:
        """`table`'s size on disk as `size_statement` reports it; None where the engine reports none."""
        stmt = self.size_statement(table)
        row = None if stmt is None else conn.execute(stmt).first()
        if row is None or row[0] is None:
            return None
        return TableSize(int(row[0]), int(row[1] or 0))

    # --- error classification (by driver error code, never by message text) --------------------------------

    def is_duplicate(self, exc: DBAPIError) -> bool:
        """True only for a primary-key / unique violation."""
        raise NotImplementedError

    def is_already_created(self, exc: DBAPIError) -> bool:
        """True if a CREATE failed because another session created the same table or index first (so
        `create_tables`, re-run, finds it). The default: nothing is (an engine that serializes DDL never races)."""
        return False


    def redact(self, exc: DBAPIError) -> None:
        """Remove from a failed store statement's driver error any text that repeats stored values (a row's
        contents); the statement's parameters are already hidden. Most drivers never repeat values: no-op."""

    def config_problem(self, exc: DBAPIError, context: ExceptionContext, tables: Sequence[str]) -> str | None:
        """``guard.MISSING_TABLE`` or ``guard.NO_PRIVILEGE`` if a store statement failed because its table does not
        exist or the role lacks a privilege (by driver error code), else None."""
        return None

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        """Why `run` may retry after `exc`, or None if it must not. Backends classify their driver's codes and
        defer to this for the library's own transient errors, connections SQLAlchemy saw drop, and a socket an
        async driver lost mid-statement (asyncpg and aiosqlite's thread raise OSError/ConnectionError unwrapped)."""
        if isinstance(exc, TransientError):
            return exc.cause
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            return RetryCause.CONNECTION
        if isinstance(exc, ConnectionError):
            return RetryCause.CONNECTION
        return None

    # --- what tooling asks of the engine (migrations, benchmarks) -------------------------------------------

    def migration_table(self, table: Table) -> None:
        """Make `table` declare for Alembic's autogenerate what this backend's DDL hooks do at create time (which
        autogenerate never runs). Most backends create exactly what the table declares: no-op."""

    @classmethod
    def pool_reset_round_trip(cls, pool: Pool) -> bool:
        """Whether `pool`'s reset of a returned connection costs a round trip to the server when no transaction is
        open. Most drivers skip it then (psycopg), or the database is in-process (SQLite): False."""
        return False

    @classmethod
    def implicit_begin(cls, driver: str) -> str | None:
        """The BEGIN `driver` sends on its own, not through a cursor SQLAlchemy sees (one more round trip per
        transaction that a statement count must add), if it sends one (`Driver.implicit_begin`)."""
        known = cls.driver(driver)
        return None if known is None else known.implicit_begin
