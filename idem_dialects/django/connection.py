"""The store on Django's own connection: the protocol's SQL runs on the DBAPI connection Django holds for a database
alias, inside Django's transaction, so the record commits or rolls back with the ORM's writes.

How: the flows are driven by the sync store's loop (`SyncStore.drive`) on a `DjangoExecutor`: a `Transaction` step is
Django's `transaction.atomic(using=alias)` (a savepoint when the caller is already in an atomic block), and the store's
statements run natively on Django's DBAPI connection for that alias, not a second connection. An SQLAlchemy
`Connection` is still wrapped around that DBAPI connection (`BorrowedConnection`), because effects get SQLAlchemy's
Connection and the schema's DDL and the dialect's first-connection setup need one; its commit and rollback are
no-ops, since the transaction is Django's. The SQLAlchemy engine is only a dialect and its listeners; its pool never
connects.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from django.db import DatabaseError as DjangoDatabaseError
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError, NoSuchModuleError
from sqlalchemy.pool import NullPool, PoolProxiedConnection

from ..api import Executor, StoreAPI
from ..core import Core
from ..errors import ConfigurationError
from ..execution.sync import execute_native
from ..fingerprint import Encoder
from ..limits import DEFAULT_RETENTION, check_retention
from ..retry import RetryPolicy
from ..sqla import NothingToReturn
from ..steps import Begin, Statement
from ..store import SyncStore
from ..telemetry import MeterProvider, TracerProvider

T = TypeVar("T")


class BorrowedConnection(NothingToReturn, PoolProxiedConnection):
    """Django's DBAPI connection as SQLAlchemy's `Connection` expects to hold it: SQLAlchemy may begin, commit and roll
    back its own view of the transaction (autobegin, savepoints), but nothing reaches the DBAPI connection except
    statements; Django begins, commits and rolls back. A connection SQLAlchemy finds broken is closed through Django,
    which opens a new one at its next use."""

    def __init__(self, wrapper: BaseDatabaseWrapper) -> None:
        self._wrapper = wrapper
        self.dbapi_connection = wrapper.connection
        self._info: dict[Any, Any] = {}  # what backends remember per DBAPI connection (e.g. a session setting made)
        self._valid = True

    @property
    def driver_connection(self) -> Any:  # type: ignore[override]
        return self.dbapi_connection

    @property
    def info(self) -> dict[Any, Any]:
        return self._info

    @property
    def record_info(self) -> dict[Any, Any]:
        return self._info

    @property
    def is_valid(self) -> bool:
        return self._valid

    @property
    def is_detached(self) -> bool:
        return False

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return self.dbapi_connection.cursor(*args, **kwargs)  # type: ignore[union-attr]

    def commit(self) -> None:
        """Django commits (leaving the outermost atomic block)."""

    def rollback(self) -> None:
        """Django rolls back (an atomic block left by an exception)."""

    def invalidate(self, e: BaseException | None = None, soft: bool = False) -> None:
        self._valid = False
        if not soft:
            self._wrapper.close()  # inside an atomic block Django marks it for rollback and reconnects later

    def detach(self) -> None:
        raise ConfigurationError("Django's connection cannot be detached from Django")

    def close(self) -> None:
        """Django closes its connection (CONN_MAX_AGE, the end of a request)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dbapi_connection, name)


def engine_url(wrapper: BaseDatabaseWrapper) -> URL:
    """The SQLAlchemy URL of Django's connection: its vendor as the backend (MariaDB told apart, as Django does), its
    DBAPI module as the driver, and where it connects (never the password: nothing connects through this URL)."""
    wrapper.ensure_connection()
    backend = "mariadb" if getattr(wrapper, "mysql_is_mariadb", False) else wrapper.vendor
    module = type(wrapper.connection).__module__.split(".")[0]
    settings = wrapper.settings_dict
    where: dict[str, Any] = {"database": str(settings.get("NAME") or "") or None,
                             "host": settings.get("HOST") or None, "username": settings.get("USER") or None}
    if settings.get("PORT"):
        where["port"] = int(settings["PORT"])
    for name in (f"{backend}+{module.lower()}", backend):  # a driver SQLAlchemy names after the module, or the default
        url = URL.create(name, **where)
        try:
            dbapi = url.get_dialect().import_dbapi()
        except (NoSuchModuleError, ImportError):
            continue
        if dbapi.__name__.split(".")[0] == module:
            return url
    raise ConfigurationError(f"Django database {wrapper.alias!r}: SQLAlchemy has no dialect for {wrapper.vendor}"
                             f" through the {module} driver module, so idem-dialects cannot run its statements there")


class DjangoExecutor:
    """The `Executor` on Django's connection for a database alias: a transaction is Django's
    `transaction.atomic(using=alias)` (a savepoint when the caller is already in an atomic block), and the store's
    statements run natively on Django's DBAPI connection for that alias, not a second connection."""

    def __init__(self, using: str, engine: Engine, core: Core) -> None:
        self.using, self.engine, self._core = using, engine, core
        self._borrowed: weakref.WeakKeyDictionary[BaseDatabaseWrapper, BorrowedConnection] = weakref.WeakKeyDictionary()
        self._initialized = False
        self._lock = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """An SQLAlchemy Connection on Django's connection for the alias, in whatever transaction Django has open."""
        wrapper = connections[self.using]
        wrapper.ensure_connection()
        borrowed = self._borrowed.get(wrapper)
        if borrowed is None or borrowed.dbapi_connection is not wrapper.connection or not borrowed.is_valid:
            borrowed = self._borrowed[wrapper] = BorrowedConnection(wrapper)
            self._core.backend.session_setup(wrapper.connection)  # a new DBAPI connection: Django's transaction ends it
        conn = Connection(self.engine, connection=borrowed)
        try:
            if not self._initialized:
                self._initialize(conn)
            yield conn
        finally:
            conn.close()

    def _initialize(self, conn: Connection) -> None:
        # What an engine does on its first connection (the server's version, its settings), minus the ROLLBACK that
        # follows it there: here the transaction may be Django's.
        with self._lock:
            if not self._initialized:
                self.engine.dialect.initialize(conn)
                self._initialized = True

    @contextmanager
    def transaction(self, begin: Begin) -> Iterator[Connection]:
        # `begin` is the backend's way to begin its own transactions; in Django the connection's settings decide
        # (e.g. SQLite's OPTIONS {"transaction_mode": "IMMEDIATE"}).
        try:
            with transaction.atomic(using=self.using), self.connection() as conn:
                yield conn
        except (DjangoDatabaseError, DBAPIError):
            # A connection that died under Django's BEGIN or COMMIT is closed only at the request's end; close it now
            # (as Django would then) so that a retry of this attempt gets a new one.
            wrapper = connections[self.using]
            if not wrapper.in_atomic_block:
                wrapper.close_if_unusable_or_obsolete()
            raise

    def execute(self, conn: Connection, statement: Statement, params: Mapping[str, Any]) -> Any:
        return execute_native(conn, self._core.backend, statement, params)

    def catalog(self, conn: Connection, action: Callable[[Connection], T]) -> T:
        return action(conn)

    def check(self, conn: Connection) -> None:
        """Any Connection on Django's connection (`DjangoStore.connection()`, or an effect's) may be used."""

    def close(self) -> None:
        """Django closes its connections (CONN_MAX_AGE, the end of a request)."""


class DjangoStore(SyncStore[Connection]):
    """A store on Django's connection for the database alias `using`, with IdempotencyStore's API: every transaction
    the protocol runs is a Django atomic block there, so a record commits with the ORM's writes or not at all.
    Thread-safe (Django gives each thread its own connection); share one per alias (`idem_dialects.django.get_store`).
    Effects get an SQLAlchemy Connection on Django's connection."""

    executor: DjangoExecutor

    def __init__(self, using: str = "default", *, table_prefix: str = "idem_", retry: RetryPolicy | None = None,
                 encoder: Encoder | None = None, retention: timedelta = DEFAULT_RETENTION,
                 tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None) -> None:
        self.using = using
        url = engine_url(connections[using])
        self.engine = create_engine(url, poolclass=NullPool, creator=_never_connects, hide_parameters=True)
        core = Core(self.engine, table_prefix, retry, encoder, check_retention(retention),
                    tracer_provider=tracer_provider, meter_provider=meter_provider, own_transactions=False,
                    retry_filter=self._retryable)
        super().__init__(core, DjangoExecutor(using, self.engine, core))

    def _retryable(self, exc: BaseException) -> BaseException | None:
        """What the backend is shown of `exc` to classify for a retry. Classified after our atomic block ended: one
        still open is the caller's (ATOMIC_REQUESTS, an outer atomic), in which our block was a savepoint. An error
        there (a deadlock, a lost connection) may have ended or doomed the caller's transaction, so the attempt is
        not run again inside it: the error goes to the caller. A database error Django raised (its BEGIN, COMMIT or
        ROLLBACK, the view's ORM) is shown as SQLAlchemy raises the same driver error, so the backend classifies it
        by the driver's code as it classifies its own statements'."""
        if connections[self.using].in_atomic_block:
            return None
        dialect = self.engine.dialect
        orig = exc.__cause__
        if not isinstance(exc, DjangoDatabaseError) or not isinstance(orig, dialect.loaded_dbapi.Error):
            return exc
        return DBAPIError.instance(None, None, orig, dialect.loaded_dbapi.Error, dialect=dialect,
                                   connection_invalidated=dialect.is_disconnect(orig, None, None))

    def __repr__(self) -> str:
        return f"DjangoStore(using={self.using!r}, table_prefix={self.table_prefix!r})"

    def connection(self) -> AbstractContextManager[Connection]:
        """An SQLAlchemy Connection on Django's connection for the alias, in whatever transaction Django has open."""
        return self.executor.connection()


def _never_connects() -> NoReturn:
    raise ConfigurationError("a DjangoStore's engine never opens connections: it runs on Django's")


if TYPE_CHECKING:  # mypy holds each class against its declared surface (api.py)
    def _surface(it: DjangoStore) -> StoreAPI[Connection]:
        return it

    def _executor(it: DjangoExecutor) -> Executor[Connection]:
        return it
