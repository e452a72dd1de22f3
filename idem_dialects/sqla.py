"""SQLAlchemy's private names, in one place: every one the library leans on is reached through this module, and
`PINNED` lists each for tests/test_sqla_pins.py, which fails loudly (naming it) if a SQLAlchemy release moves one.
pyproject.toml pins SQLAlchemy below the next minor release for the same reason; CI runs the conformance suite on the
oldest 2.0 release the project supports and on the newest.

Why private names at all: the store runs its statements on the driver's own API, under the transaction SQLAlchemy
holds (docs: Development, how a statement runs). That needs SQLAlchemy's async adapters' driver connection and
their one-statement-at-a-time lock, its translation of driver errors, and its type processors — each used as
SQLAlchemy itself uses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Dialect
    from sqlalchemy.types import TypeEngine

# (where, name): the class (by import path) and the private member of it the library uses. The async adapters are
# named one by one: their common base moved between SQLAlchemy 2.0 and 2.1. Two members only 2.1 has are used where
# present: psycopg's adapter's `_handle_exception` (before it psycopg's own errors, PEP 249's already, pass through)
# and aiosqlite's adapter's `_execute_mutex` (a store's connection serves one task at a time anyway).
_ADAPTERS = ("sqlalchemy.dialects.postgresql.asyncpg.AsyncAdapt_asyncpg_connection",
             "sqlalchemy.dialects.postgresql.psycopg.AsyncAdapt_psycopg_connection",
             "sqlalchemy.dialects.sqlite.aiosqlite.AsyncAdapt_aiosqlite_connection",
             "sqlalchemy.dialects.mysql.asyncmy.AsyncAdapt_asyncmy_connection")
PINNED: tuple[tuple[str, str], ...] = (
    ("sqlalchemy.engine.Connection", "_handle_dbapi_exception"),
    ("sqlalchemy.types.TypeEngine", "_cached_bind_processor"),
    ("sqlalchemy.types.TypeEngine", "_cached_result_processor"),
    ("sqlalchemy.pool.base._ConnectionFairy", "_close_special"),  # what `Connection.close()` calls
    ("sqlalchemy.engine.Connection", "_echo"),  # an instance's
    *((adapter, "_connection") for adapter in _ADAPTERS),
    *((adapter, "_handle_exception") for adapter in _ADAPTERS if "psycopg" not in adapter),
    *((adapter, "_execute_mutex") for adapter in _ADAPTERS if "asyncpg" in adapter or "asyncmy" in adapter),
    (_ADAPTERS[0], "_transaction"),
    (_ADAPTERS[0], "_start_transaction"),
)


_UNLOCKED = nullcontext()


# --- SQLAlchemy's async adapters (the DB-API connection an AsyncEngine's pool holds) ------------------------------


# Getters, not functions, where every statement reads them: no Python call per statement.

driver_connection: Callable[[Any], Any] = attrgetter("_connection")
"""The async driver's own connection (asyncpg's, psycopg's, aiosqlite's, asyncmy's) under SQLAlchemy's adapter."""

execute_mutex: Callable[[Any], asyncio.Lock] = attrgetter("_execute_mutex")
"""The lock of the adapters that always have one (asyncpg, asyncmy) keeping one statement at a time on its
connection."""


def statement_lock(adapter: Any) -> AbstractAsyncContextManager[Any]:
    """The adapter's lock that keeps one statement at a time on its connection, if it has one (aiosqlite's from
    SQLAlchemy 2.1 on)."""
    return getattr(adapter, "_execute_mutex", None) or _UNLOCKED


def raise_as_adapter(adapter: Any, error: Exception) -> NoReturn:
    """Raise a driver's `error` as the adapter raises it: its emulation of PEP 249's classes, the SQLSTATE kept.
    SQLAlchemy 2.0's psycopg adapter translates nothing (psycopg's own errors are PEP 249's): they go as they are."""
    handle = getattr(adapter, "_handle_exception", None)
    if handle is not None:
        handle(error)
    raise error


def asyncpg_begin(adapter: Any) -> Awaitable[None] | None:
    """What begins the asyncpg adapter's transaction, as its first statement would (BEGIN on first use), to await;
    None once begun (an awaitable rather than a coroutine: nothing in between to resume after the BEGIN). SQLAlchemy
    2.0's adapter keeps a `_started` flag beside the transaction; 2.1's the transaction alone."""
    if getattr(adapter, "_started", adapter._transaction is not None):
        return None
    return adapter._start_transaction()  # type: ignore[no-any-return]


def asyncpg_take_transaction(adapter: Any) -> Any:
    """The asyncpg adapter's transaction, forgotten by it as its own commit() does (whatever the outcome)."""
    transaction, adapter._transaction = adapter._transaction, None
    if hasattr(adapter, "_started"):  # SQLAlchemy 2.0
        adapter._started = False
    return transaction


# --- the sync engine ------------------------------------------------------------------------------------------------


def handle_dbapi_exception(conn: Connection, error: BaseException, sql: str, cursor: Any) -> NoReturn:
    """Raise a driver's `error` as `Connection.execute` does: wrapped, told to ``handle_error`` listeners, the
    connection invalidated on a disconnect."""
    conn._handle_dbapi_exception(error, sql, None, cursor, None)
    raise AssertionError("unreachable")  # pragma: no cover - _handle_dbapi_exception always raises


def bind_processor(type_: TypeEngine[Any], dialect: Dialect) -> Any:
    """The type's bind processor for `dialect`, cached by SQLAlchemy as for its own statements."""
    return type_._cached_bind_processor(dialect)


def result_processor(type_: TypeEngine[Any], dialect: Dialect, coltype: Any) -> Any:
    """The type's result processor for `dialect` and the driver's column type, cached as for SQLAlchemy's own."""
    return type_._cached_result_processor(dialect, coltype)


class unlogged:
    """Out of SQLAlchemy's engine log for the block. With echo=True/"debug", or the ``sqlalchemy.engine`` logger at
    INFO/DEBUG, a connection logs each statement and its result rows - a replay's row holds the stored response and
    the claim token, which hide_parameters does not cover. The flag is per connection, so the caller's effect on the
    same connection is logged as before."""

    __slots__ = ("_conn", "_echo")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._echo = getattr(conn, "_echo", False)

    def __enter__(self) -> None:
        if self._echo:
            self._conn._echo = False

    def __exit__(self, *exc: object) -> None:
        if self._echo:
            self._conn._echo = self._echo


class NothingToReturn:
    """A `PoolProxiedConnection` that belongs to no pool (Django's connection under SQLAlchemy's `Connection`):
    what `Connection.close()` calls after closing its own transaction has nothing to give back."""

    def _close_special(self, transaction_reset: bool = False) -> None:
        pass
