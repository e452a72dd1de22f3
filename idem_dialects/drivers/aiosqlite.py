"""aiosqlite (``sqlite+aiosqlite://``): sqlite3 on a thread of its own; the store's statements go straight to it, each
in one hop to that thread, and a `Statements` step (a claim, a completion) whole in one hop (`in_thread`). Its logger
at DEBUG records each function its thread runs: its own `execute` with the statement's parameters, the store's as a
closure that shows none of them (so the store's statements keep their values out of that log, as out of
SQLAlchemy's)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.pool import PoolResetState

from ..sqla import driver_connection, raise_as_adapter, statement_lock
from ..steps import Shape
from . import Compiled, Driver, E
from .pysqlite import AUTOCOMMIT

# aiosqlite's private names the store uses, as SQLAlchemy's adapter does for its isolation_level setter: the queue of
# (future, function) its thread runs in order, the sqlite3 connection there (ValueError once closed), and whether
# the connection is open (`close` stops its thread). Pinned by tests/test_aiosqlite_hops.py.
PINNED = ("_tx", "_conn", "_running")


class Aiosqlite(Driver):
    # SQLAlchemy's adapter sends its own COMMIT, a hop of its own, whatever went before it, so a native one would
    # cost a second hop for nothing. Its errors are then SQLAlchemy's commit's, wrapped as the sync store's are and
    # classified for `run`'s retries alike.
    commits_natively = False

    async def execute(self, connection: Any, plan: Compiled, parameters: Any) -> Any:
        # One hop: aiosqlite's own execute, fetch and close would be three, each a wake-up of both threads.
        async with statement_lock(connection):
            try:
                return await _queue(driver_connection(connection), lambda raw: _statement(raw, plan, parameters))
            except Exception as error:
                raise_as_adapter(connection, error)

    def own_engine(self, create: Callable[..., E], options: dict[str, Any]) -> E:
        if "pool_reset_on_return" in options:  # the caller's choice
            return create(**options)
        # The pool's rollback when a connection comes back is a hop to aiosqlite's thread even when there is nothing
        # to roll back, as after every transaction of the store's (committed or rolled back before it comes back):
        # rolled back only when it is in a transaction.
        engine = create(**options, pool_reset_on_return=None)
        event.listen(getattr(engine, "sync_engine", engine), "reset", _reset)
        return engine

    def in_thread(self, connection: Any, work: Callable[[Any], Any]) -> asyncio.Future[Any] | None:
        aconn = driver_connection(connection)
        # Closed: the statements go one by one (`execute`), the first failing as aiosqlite's own execute would.
        return _queue(aconn, work) if aconn._running else None

    def interrupt(self, connection: Any) -> None:
        try:
            raw = driver_connection(connection)._conn
        except ValueError:  # closed: nothing runs on it
            return
        else:
            # sqlite3's one call meant for another thread: a statement running fails "interrupted" (a wait for the
            # write lock does not heed it: that ends within the busy timeout).
            raw.interrupt()


def _reset(dbapi_connection: Any, record: Any, state: PoolResetState) -> None:
    # As SQLAlchemy's own reset: nothing to await from a garbage collection, nothing to do after a rollback.
    if not state.asyncio_safe or state.transaction_was_reset:
        return
    try:
        # A property of the sqlite3 connection, read on the loop's thread: no statement runs on it once it is back.
        began = driver_connection(dbapi_connection).in_transaction
    except Exception:  # closed or broken: the rollback says how, as SQLAlchemy's would
        began = True
    if began:
        dbapi_connection.rollback()


def _queue(aconn: Any, work: Callable[[Any], Any]) -> asyncio.Future[Any]:
    """`work(sqlite3 connection)` on aiosqlite's thread, as aiosqlite's `_execute` queues it, without its coroutine and
    partial. The future is the loop's: a cancelled await leaves the work queued or running to its end."""
    future = asyncio.get_running_loop().create_future()
    if not aconn._running:  # closed: its thread is gone, or going, and would never run `work`
        future.set_exception(ValueError("Connection closed"))  # aiosqlite's, which SQLAlchemy reads as a disconnect
        return future

    def run() -> Any:
        return work(aconn._conn)  # closed: aiosqlite's ValueError, which SQLAlchemy's adapter translates

    aconn._tx.put_nowait((future, run))
    return future


def _statement(raw: Any, plan: Compiled, parameters: Any) -> tuple[Any, Any]:
    cursor = raw.cursor()
    try:
        cursor.execute(plan.sql, parameters)
        shape = plan.shape
        if shape is Shape.ROW:
            return cursor.fetchone(), cursor.description
        if shape is Shape.ROWS:
            return cursor.fetchall(), cursor.description
        return (cursor.rowcount if shape is Shape.ROWCOUNT else None), None
    finally:
        cursor.close()


DRIVER = Aiosqlite("aiosqlite", "aiosqlite", "idem-dialects[aiosqlite]", sync=False, asynchronous=True,
                   autocommit_args=AUTOCOMMIT)
