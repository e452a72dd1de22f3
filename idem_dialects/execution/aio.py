"""Executing a flow's `Exec` steps on an async connection: on the async driver's own API where its driver module
has a native form (asyncpg, psycopg, aiosqlite, asyncmy), else through SQLAlchemy's `AsyncConnection.run_sync`.

A native statement costs no greenlet switch: it awaits the driver in the task itself, in the transaction SQLAlchemy's
adapter holds. Only its error goes through a greenlet, to be wrapped and classified as SQLAlchemy's own statements'
errors are (invalidating the connection on a disconnect may need to await).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from contextlib import AbstractContextManager
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

from ..sqla import raise_as_adapter, statement_lock
from ..steps import Exec, Flow, Statement, Stepper
from .plan import Plan, plan, read
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
    try:
        compiled: Plan = statement.compiled[conn.dialect]  # `plan`'s cache, without its call once filled
    except KeyError:
        compiled = plan(statement, conn.dialect)
    if not conn.in_transaction():
        conn.begin()  # SQLAlchemy's bookkeeping only: nothing awaits (the adapter begins on first use)
    adapted = conn.connection.dbapi_connection
    try:
        answer, description = await driver.execute(adapted, compiled, compiled.parameters(params))
    except Exception as error:
        await aconn.run_sync(_raise, backend, statement.tables, compiled.sql, error, adapted)
        raise  # pragma: no cover - _raise always raises
    except BaseException:
        _interrupted(conn)
        raise
    return compiled.result(answer, description)


async def commit_async(aconn: AsyncConnection, backend: Backend, driver: Driver) -> None:
    """Commit the store's transaction on `aconn` on the driver's own API: SQLAlchemy's commit, which follows for its
    bookkeeping (and the backend's `transaction` hook), finds nothing left to send. An error is raised as the adapter
    raises it, then wrapped and classified as a statement's is."""
    conn = aconn.sync_connection
    assert conn is not None
    adapted = conn.connection.dbapi_connection
    try:
        committing = driver.commit(adapted)
        if committing is not None:
            await committing
    except Exception as error:
        try:
            raise_as_adapter(adapted, error)
        except Exception as translated:
            await aconn.run_sync(_raise, backend, (), "COMMIT", translated, adapted)
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


class InTransaction:
    """An async executor's transaction (`AsyncEngineExecutor.transaction`): `open()`, run in SQLAlchemy's greenlet,
    checks a connection out in a transaction begun the backend's way (after taking its turn on `turns`, a shared
    connection's lock, if any); the block gets it as an AsyncConnection. Leaving commits - the COMMIT on
    `committer`'s own API where it has one (no greenlet switch to send it), then SQLAlchemy's commit, with nothing
    left to send - or rolls back, and gives the connection back (`end_transaction`). A class rather than an
    `asynccontextmanager`: a generator and its context manager cost a dozen calls per transaction."""

    __slots__ = ("_backend", "_committer", "_conn", "_ending", "_engine", "_open", "_turns")

    _conn: AsyncConnection
    _ending: AbstractContextManager[Any]

    def __init__(self, engine: AsyncEngine, open: Callable[[], tuple[Connection, AbstractContextManager[Any]]],
                 backend: Backend, committer: Driver | None, turns: asyncio.Lock | None) -> None:
        self._engine, self._open, self._backend, self._committer, self._turns = engine, open, backend, committer, turns

    async def __aenter__(self) -> AsyncConnection:
        turns = self._turns
        if turns is not None:
            await turns.acquire()
        try:
            sync, self._ending = await greenlet_spawn(self._open)
        except BaseException:
            if turns is not None:
                turns.release()
            raise
        self._conn = AsyncConnection(self._engine, sync)
        return self._conn

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        conn, ending = self._conn, self._ending
        try:
            if exc is None and self._committer is not None:
                try:
                    await commit_async(conn, self._backend, self._committer)
                except BaseException as failed:
                    await end_transaction(conn, ending, failed)
                    raise
            await end_transaction(conn, ending, exc)
        finally:
            if self._turns is not None:
                self._turns.release()


def end_transaction(conn: AsyncConnection, ending: AbstractContextManager[Any],
                    exc: BaseException | None) -> Awaitable[None]:
    """Commit (`exc` None) or roll back after `exc` (an error, or the task's cancellation), and give the connection
    back, in one greenlet; if that fails or is interrupted, discard the connection so the pool never hands out one
    in an unknown state.

    It runs to completion even if the task is cancelled meanwhile, as SQLAlchemy's own `AsyncConnection.close()`
    does from 2.1 on: a ROLLBACK, or the pool's reset on check-in, cut off partway leaves a connection in an unknown
    state (and an ERROR in the pool's log). The cancellation reaches the caller once the connection is back."""
    return to_completion(_end(conn, ending, exc))  # not a coroutine more to await


async def _end(conn: AsyncConnection, ending: AbstractContextManager[Any], exc: BaseException | None) -> None:
    try:
        # `run_sync` without its lookups: the connection is the one the store checked out.
        await greenlet_spawn(_finish, conn.sync_connection, ending, exc)
    except BaseException:
        with contextlib.suppress(BaseException):
            await conn.invalidate()
        with contextlib.suppress(BaseException):
            await conn.close()
        if exc is None:
            raise


def _finish(sync: Connection, ending: AbstractContextManager[Any], exc: BaseException | None) -> None:
    interrupted = exc is not None and not sync.invalidated and sync.info.pop(INTERRUPTED, False)
    try:
        ending.__exit__(None if exc is None else type(exc), exc, None if exc is None else exc.__traceback__)
    finally:
        if interrupted:
            # Cut off mid-statement, the connection's state is unknown: discarded rather than reset by the pool (a
            # reset's ROLLBACK failing there is the pool's ERROR log). The server ends its transaction.
            sync.invalidate()
        sync.close()


async def statements_async(aconn: AsyncConnection, backend: Backend, driver: Driver, body: Flow[T],
                           hook: Callable[[str, bool], None] | None) -> Flow[T]:
    """Run a `Statements` step's `body` on a driver whose connection lives on a thread of its own: the flow is
    stepped there, each statement run on the PEP 249 connection, all in one hop (`Driver.in_thread`), in the
    transaction SQLAlchemy holds. A statement's error, or the task's cancellation, ends the hop: the error is wrapped
    and classified here as `execute_async` does it. What is left of the flow comes back as a flow for the store's
    loop to drive statement by statement (the one loop that does), the error or cancellation thrown into it first;
    a flow that ended in the hop comes back as one with no step left. `hook` is told of the statements the hop ran
    once it is back (a hook is the caller's code: it runs on the loop).

    The flow's code runs in a copy of the task's context (whichever thread steps it, `_rest` included), so what it
    sets and resets between its statements pairs up; a cancelled task waits for its hop to end (interrupted at its
    statement), so the flow is never stepped from two places and the connection is never left mid-statement."""
    conn = aconn.sync_connection
    assert conn is not None
    if not conn.in_transaction():
        conn.begin()  # SQLAlchemy's bookkeeping only, as for a native statement
    adapted = conn.connection.dbapi_connection
    hop = _Hop(Stepper(body), conn.dialect, contextvars.copy_context(), hook is not None)
    async with statement_lock(adapted):
        future = driver.in_thread(adapted, hop.work)
        cancelled: asyncio.CancelledError | None = None
        if future is not None:
            while True:
                try:
                    await asyncio.shield(future)
                    break
                except asyncio.CancelledError as cancel:
                    if not future.done():
                        cancelled, hop.stop = cancel, True
                        driver.interrupt(adapted)  # the statement running now fails at once; none runs after it
                        continue
                    if future.cancelled():  # the loop is closing
                        raise
                    cancelled = cancel
                    break
                except BaseException:
                    break  # the flow's own error: raised below, once the hook has been told
    if hook is not None:
        hop.tell(hook)
    if future is None:
        return _rest(hop)
    error = future.exception() if future.done() and not future.cancelled() else None
    if error is not None:
        if cancelled is not None:
            raise cancelled from error
        raise error
    if hop.failed is not None and cancelled is None:
        step, compiled, failure = hop.failed
        try:
            try:
                raise_as_adapter(adapted, failure)
            except Exception as translated:
                await aconn.run_sync(_raise, backend, step.statement.tables, compiled.sql, translated, adapted)
        except BaseException as wrapped:
            hop.stepper.throw(wrapped)  # the flow's next step sees it: SQLite's busy retries happen there
    elif cancelled is not None:
        if hop.finished:
            raise cancelled
        hop.stepper.throw(cancelled)
    return _rest(hop)


class _Hop:
    """A `Statements` step's flow stepped on the driver's thread (`work`) until it ends or a statement fails."""

    def __init__(self, stepper: Stepper[Any], dialect: Dialect, context: contextvars.Context, telling: bool) -> None:
        self.stepper, self.dialect, self.context = stepper, dialect, context
        self.told: list[str] | None = [] if telling else None  # the SQL of each statement sent, for the hook
        self.ran = 0  # how many of them succeeded
        self.failed: tuple[Exec, Plan, Exception] | None = None
        self.stop = False  # set from the loop: the task was cancelled
        self.finished = False  # the flow returned (its value is the stepper's)

    def work(self, dbapi: Any) -> None:
        self.context.run(self._run, dbapi)

    def _run(self, dbapi: Any) -> None:
        # Not sync.execute_native, though the statement is run alike (`plan`, `read`): that one hands a failing
        # cursor to SQLAlchemy's error handling, which cannot run on this thread (the error is wrapped on the loop).
        stepper, told = self.stepper, self.told
        while (step := stepper.next()) is not None:
            if not isinstance(step, Exec):
                raise TypeError(f"a Statements step yields statements only, not {type(step).__name__}")
            if self.stop:
                return  # `step` not sent: the cancellation is thrown into the flow where it yielded it
            compiled = plan(step.statement, self.dialect)
            if told is not None:
                told.append(compiled.sql)
            cursor = dbapi.cursor()
            try:
                cursor.execute(compiled.sql, compiled.parameters(step.params))
                answer, description = read(cursor, compiled)
            except Exception as error:
                self.failed = (step, compiled, error)
                return
            finally:
                cursor.close()
            self.ran += 1
            stepper.send(compiled.result(answer, description))
        self.finished = True

    def tell(self, hook: Callable[[str, bool], None]) -> None:
        for i, sql in enumerate(self.told or ()):
            hook(sql, False)
            if i < self.ran:
                hook(sql, True)


def _rest(hop: _Hop) -> Flow[Any]:
    """What is left of a hop's flow as a flow of its own, for the store's loop: each statement the flow yields next
    (stepped in its context, the hop's error or cancellation first) handed on, its result or error handed back."""
    stepper, context = hop.stepper, hop.context
    if not hop.finished:
        while (step := context.run(stepper.next)) is not None:
            try:
                if not isinstance(step, Exec):
                    raise TypeError(f"a Statements step yields statements only, not {type(step).__name__}")
                stepper.send((yield step))
            except BaseException as exc:
                stepper.throw(exc)
    return stepper.value
