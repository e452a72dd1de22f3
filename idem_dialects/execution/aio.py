"""Executing a flow's `Exec` steps on an async connection: on the async driver's own API where its driver module
has a native form (asyncpg, psycopg, aiosqlite, asyncmy), else through SQLAlchemy's `AsyncConnection.run_sync`.

A native statement costs no greenlet switch: it awaits the driver in the task itself, in the transaction SQLAlchemy's
adapter holds. Only its error goes through a greenlet, to be wrapped and classified as SQLAlchemy's own statements'
errors are (invalidating the connection on a disconnect may need to await).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from ..steps import Statement
from .plan import plan
from .sync import execute_sqlalchemy, raise_handled

# In a connection's `info`: a native statement on it was cut off midway (`_interrupted`).
INTERRUPTED = "idem_dialects.interrupted"

T = TypeVar("T")

if TYPE_CHECKING:
    from ..dialects.base import Backend
    from ..drivers import Driver


async def execute_async(aconn: AsyncConnection, backend: Backend, driver: Driver | None, statement: Statement,
                        params: Mapping[str, Any]) -> Any:
    """Run `statement` on `aconn`: natively where `driver` has a native form, else through `run_sync`."""
    if driver is None:
        return await aconn.run_sync(execute_sqlalchemy, statement, params)
    conn = aconn.sync_connection
    assert conn is not None
    compiled = plan(statement, conn.dialect)
    if not conn.in_transaction():
        conn.begin()  # SQLAlchemy's bookkeeping only: nothing awaits (the adapter begins on first use)
    adapted = conn.connection.dbapi_connection
    try:
        answer, description = await driver.execute(adapted, compiled.sql, compiled.parameters(params), compiled.shape)
    except Exception as error:
        await aconn.run_sync(_raise, backend, statement.tables, compiled.sql, error, adapted)
        raise  # pragma: no cover - _raise always raises
    except BaseException:
        _interrupted(conn)
        raise
    return compiled.result(answer, description)


async def commit_async(aconn: AsyncConnection, backend: Backend, driver: Driver) -> None:
    """Commit the store's transaction on `aconn` on the driver's own API: SQLAlchemy's commit, which follows for its
    bookkeeping (and the backend's `transaction` hook), finds nothing left to send. An error is wrapped and
    classified as a statement's is."""
    conn = aconn.sync_connection
    assert conn is not None
    adapted = conn.connection.dbapi_connection
    try:
        await driver.commit(adapted)
    except Exception as error:
        await aconn.run_sync(_raise, backend, (), "COMMIT", error, adapted)
    except BaseException:
        _interrupted(conn)
        raise


def _interrupted(conn: Connection) -> None:
    """A native statement or COMMIT interrupted (the task cancelled while it awaited the server): what the
    connection is in the middle of is unknown - a BEGIN may have gone through that the adapter never recorded, so no
    ROLLBACK would end it. SQLAlchemy invalidates a connection whose statement an exit exception interrupted; here
    the pool is told, without awaiting anything (the task is being cancelled), to replace it before its next use, and
    the connection is marked `INTERRUPTED` for whoever ends its transaction (no ROLLBACK to try on it)."""
    conn.info[INTERRUPTED] = True
    conn.connection.invalidate(soft=True)


def _raise(conn: Connection, backend: Backend, tables: tuple[str, ...], sql: str, error: Exception,
           adapted: Any) -> NoReturn:
    raise_handled(conn, backend, error, sql, tables, None, adapted)


async def to_completion(work: Coroutine[Any, Any, T]) -> T:
    """Await `work` in a task of its own that a cancellation of this one does not interrupt; such a cancellation is
    raised here once `work` is done.

    A task per request is dozens of calls and three turns of the loop more, so `work` runs in this task for as long
    as nothing cancels it: each future it waits for is waited for here through a future of this function's own (a
    cancellation cancels that one, never `work`'s), a turn of the loop more per wait. Only a cancellation (or a wait
    of another kind) hands the rest of `work` to a task of its own. An end that never waits (asyncpg's and
    psycopg's: the COMMIT went on the driver's own API) costs nothing more."""
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            waiting = work.send(None)  # after a wait: the future is done, and `work` reads it
        except StopIteration as done:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                # Cancelled meanwhile (or already): raised here, as from the task's wait below, not at some later await.
                await asyncio.sleep(0)
            return done.value  # type: ignore[no-any-return]
        if not isinstance(waiting, asyncio.Future):  # a bare yield, or another kind of future: the task's business
            break
        woken: asyncio.Future[None] = asyncio.Future(loop=waiting.get_loop())
        waiting.add_done_callback(partial(_wake, woken))
        try:
            await woken
        except asyncio.CancelledError as cancel:
            cancelled = cancel
            break
    task = asyncio.ensure_future(_Resumed(work, waiting))
    while True:
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as cancel:
            if task.done():  # `work` itself was cancelled (its loop is closing)
                raise
            cancelled = cancel
        else:
            break
    if cancelled is not None:
        raise cancelled
    return task.result()


def _wake(woken: asyncio.Future[None], _: Any) -> None:
    # Guarded: the wait may have been cancelled after `waiting` was done and before this ran (the rest of the work
    # then went to a task); setting a cancelled future's result would be an error in the loop's log.
    if not woken.done():
        woken.set_result(None)


class _Resumed(Coroutine[Any, Any, T]):
    """A coroutine suspended at `waiting` (what it last gave its task to wait for), as a coroutine a new task carries
    on: the task's first step is handed `waiting`, every later one goes to the coroutine. (A coroutine's own
    interface rather than an awaitable: a task takes it without wrapping it in one more coroutine.)"""

    __slots__ = ("_waiting", "_work")

    def __init__(self, work: Coroutine[Any, Any, T], waiting: Any) -> None:
        self._work, self._waiting = work, waiting

    def send(self, value: Any) -> Any:
        waiting = self._waiting
        if waiting is not _HANDED:
            self._waiting = _HANDED
            return waiting
        return self._work.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._waiting = _HANDED
        if val is None and tb is None:
            return self._work.throw(typ)
        return self._work.throw(typ, val, tb)

    def close(self) -> None:
        self._work.close()

    def __await__(self) -> Generator[Any, Any, T]:
        raise TypeError("a task's coroutine, not to be awaited")  # pragma: no cover - only to_completion makes one


_HANDED: Any = object()  # _Resumed's `waiting` once handed to its task
