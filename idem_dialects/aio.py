"""AsyncIdempotencyStore: the same protocol on SQLAlchemy's AsyncEngine, awaited.

One protocol, no second copy: every statement, error classification and retry rule is the sync store's, executed
on the async driver through SQLAlchemy's greenlet bridge (`AsyncConnection.run_sync`). Only what must await is
written here: the transaction, awaiting the effect, sleeping between retries (asyncio.sleep), and cleaning up after
a cancelled task.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from datetime import timedelta
from importlib.util import find_spec
from types import TracebackType
from typing import Any, Self

from sqlalchemy import make_url
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table

from . import dialects
from .dialects.base import Backend
from .errors import AsyncMisuse, LeaseLost, MissingDriver, RetryCause
from .features import Features
from .guard import engine_options as guarded_options
from .limits import check_status
from .outcomes import Claimed, Outcome, Result
from .protocol import Request, finished, owning_engine, refuse_sync_effect, reply
from .retry import EffectFailed, RetryPolicy, acall_with_retry, effect_failure
from .schema import Tables
from .store import _NO_PAYLOAD, IdempotencyStore

AsyncEffect = Callable[[AsyncConnection], Awaitable[Any]]


class _Core(IdempotencyStore):
    """The sync store's protocol methods, called only inside `run_sync` on the async engine's sync facade."""

    _bridged = True


def _is_async_driver(url: URL) -> bool:
    try:
        # What create_async_engine would load: psycopg and oracledb name a sync and an async dialect.
        return bool(getattr(url.get_dialect(_is_async=True), "is_async", False))
    except (NoSuchModuleError, ArgumentError):
        return True  # unknown driver: let create_async_engine report it as SQLAlchemy does


def installed_async_drivers(backend: str) -> tuple[str, ...]:
    """The async drivers a backend declares that are importable here (what `--idem-api async` runs on)."""
    return tuple(d for d in dialects.load(backend).async_drivers if find_spec(d) is not None)


def async_drivers_hint(backend: type[Backend]) -> str:
    names = [f"{backend.name}+{driver}" for driver in backend.async_drivers]
    return " or ".join(names) if names else f"no async driver is declared for {backend.name}"


class AsyncIdempotencyStore:
    """Idempotency records for one database, for asyncio code: the sync store's API, awaited. Share one per engine.

    `async with store:` (or `await store.close()`) disposes of an engine the store created (`from_url`) and leaves
    an engine the caller passed in alone."""

    def __init__(self, engine: AsyncEngine, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None) -> None:
        if not isinstance(engine, AsyncEngine):
            raise AsyncMisuse(f"AsyncIdempotencyStore needs a sqlalchemy.ext.asyncio.AsyncEngine, got"
                              f" {type(engine).__name__}; use IdempotencyStore for a sync Engine, or build one with"
                              " create_async_engine on an async driver")
        self.engine = engine
        core = self._core = _Core(engine.sync_engine, table_prefix=table_prefix, retry=retry)
        # The sync store's own objects, shared (set once there; `features` is a property: it is refined on connect).
        self.table_prefix: str = core.table_prefix
        self.backend: Backend = core.backend
        self.tables: Tables = core.tables
        self.retry: RetryPolicy = core.retry
        self.retries: Counter[str] = core.retries  # retries `run` absorbed, by cause, since this store was made
        # One shared connection (SQLite :memory:): transactions take turns on the event loop instead of a thread lock.
        self._turns = None if self._core.features.concurrent_connections else asyncio.Lock()
        self._owns_engine = False

    @classmethod
    def from_url(
        cls, url: str | URL, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None, **engine_options: Any
    ) -> AsyncIdempotencyStore:
        """Build the AsyncEngine (options go to `create_async_engine`) and the backend its dialect name selects."""
        parsed = make_url(url)
        backend = dialects.load(parsed.get_backend_name())
        if not _is_async_driver(parsed):
            raise AsyncMisuse(f"{parsed.drivername} is not an asyncio driver: use IdempotencyStore.from_url for it,"
                              f" or an async driver here ({async_drivers_hint(backend)})")
        try:
            engine = create_async_engine(parsed, **guarded_options(backend, parsed, engine_options))
        except ImportError as exc:
            raise MissingDriver(parsed.drivername, "pip install 'idem-dialects[async]' (PostgreSQL, SQLite,"
                                " MySQL/MariaDB), '[oracle]' or '[mssql]'", exc) from exc
        return owning_engine(lambda: cls(engine, table_prefix=table_prefix, retry=retry), engine.sync_engine.dispose)

    @property
    def features(self) -> Features:
        return self._core.features

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        return self._core.retry_cause(exc)

    async def close(self) -> None:
        if self._owns_engine:
            await self.engine.dispose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncIdempotencyStore({self.engine.url.render_as_string()!r}, table_prefix={self.table_prefix!r})"

    # --- schema --------------------------------------------------------------------------------------------------

    async def create_tables(self) -> None:
        async with self.engine.begin() as conn:
            await conn.run_sync(lambda c: self.tables.metadata.create_all(c, checkfirst=True))

    async def drop_tables(self) -> None:
        async with self.engine.begin() as conn:
            await conn.run_sync(lambda c: self.tables.metadata.drop_all(c, checkfirst=True))

    # --- the step-by-step API ------------------------------------------------------------------------------------

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A connection in a transaction begun the way the engine needs (the backend's own `transaction`);
        commits on success, rolls back on an error or cancellation (or discards the connection if that fails)."""
        return self._transaction(self.backend.transaction)

    @asynccontextmanager
    async def _transaction(self, begin: Callable[[Connection], AbstractContextManager[None]]
                           ) -> AsyncIterator[AsyncConnection]:
        async with self._turn(), self._connection() as conn:
            ending = await conn.run_sync(self._begin, begin)
            try:
                yield conn
            except BaseException as exc:
                await _abort(conn, ending, exc)
                raise
            await conn.run_sync(lambda _: ending.__exit__(None, None, None))

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection]:
        """A connection; failing to open one raises what the backend's `connect_error` makes of it (CannotConnect,
        retried by `run`, or ConnectionConfigError), as the sync store's `Backend.connect` does."""
        conn = self.engine.connect()
        try:
            await conn.start()
        except Exception as exc:  # asyncpg raises OSError and its own errors unwrapped: classified all the same
            problem = self.backend.connect_error(exc)
            if problem is None:
                raise
            raise problem from exc
        try:
            yield conn
        finally:
            await conn.__aexit__(None, None, None)  # closes it even while the task is being cancelled

    def _turn(self) -> AbstractAsyncContextManager[Any]:
        return self._turns if self._turns is not None else contextlib.nullcontext()

    def _begin(self, conn: Connection, begin: Callable[[Connection], AbstractContextManager[None]]
               ) -> AbstractContextManager[None]:
        self.backend.live_features(conn)
        ending = begin(conn)
        ending.__enter__()
        return ending

    async def claim(self, conn: AsyncConnection, *, scope: str, operation: str, key: str, request: Any,
                    lease: timedelta | None = None) -> Outcome:
        """Claim the key, or tell why not (the sync store's `claim`, on this connection)."""
        return await _sync(conn).run_sync(lambda c: self._core.claim(
            c, scope=scope, operation=operation, key=key, request=request, lease=lease))

    async def complete(self, conn: AsyncConnection, claimed: Claimed, response: Any, status: int = 200) -> None:
        """Store the result in the caller's transaction, fenced by the claim token (LeaseLost if taken over)."""
        await _sync(conn).run_sync(self._core.complete, claimed, response, status)

    async def release(self, conn: AsyncConnection, claimed: Claimed) -> bool:
        """Give up a claim that was not completed; False if it was no longer held."""
        return await _sync(conn).run_sync(self._core.release, claimed)

    async def accept_message(self, conn: AsyncConnection, *, subscriber: str, message_id: str,
                             payload: Any = _NO_PAYLOAD) -> bool:
        """True the first time (subscriber, message_id) is seen, in the caller's transaction; False on redelivery."""
        return await _sync(conn).run_sync(lambda c: self._core.accept_message(
            c, subscriber=subscriber, message_id=message_id, payload=payload))

    # --- the whole protocol in one call --------------------------------------------------------------------------

    async def run(self, *, scope: str, operation: str, key: str, request: Any, effect: AsyncEffect,
                  status: int = 200, lease: timedelta | None = None, retry: RetryPolicy | None = None) -> Result:
        """Claim, await `effect(conn)` and store its response once; replay it to every retry.

        `effect` is an `async def` taking the AsyncConnection (a sync function is refused with AsyncMisuse before
        any SQL). Raises what the sync `run` raises. A cancelled task leaves no claim behind beyond its lease: an
        atomic claim rolls back with the transaction, a leased one is released."""
        req = Request.check(scope, operation, key, request, lease)
        check_status(status)
        refuse_sync_effect(effect)
        once = self._run_atomic if lease is None else self._run_leased
        return await acall_with_retry(retry or self.retry, self.retry_cause, lambda: once(req, effect, status),
                                      self._core._count_retry)

    async def _run_atomic(self, req: Request, effect: AsyncEffect, status: int) -> Result:
        async with self._transaction(self.backend.claim_transaction) as conn:
            outcome = await conn.run_sync(self._core._claim, req)
            if not isinstance(outcome, Claimed):
                return finished(outcome, req)
            response, code = await _call(effect, conn, status)
            await conn.run_sync(self._core.complete, outcome, response, code)
            return Result(response, code, replayed=False)

    async def _run_leased(self, req: Request, effect: AsyncEffect, status: int) -> Result:
        async with self._transaction(self.backend.claim_transaction) as conn:
            outcome = await conn.run_sync(self._core._claim, req)
        if not isinstance(outcome, Claimed):
            return finished(outcome, req)
        try:
            async with self.transaction() as conn:
                response, code = await _call(effect, conn, status)
                await conn.run_sync(self._core.complete, outcome, response, code)
        except LeaseLost:
            raise
        except BaseException as exc:
            # Let the next attempt claim at once instead of waiting out the lease. Shielded: a task cancelled again
            # while releasing still releases (the lease ends on its own if even that fails).
            try:
                await asyncio.shield(self._release(outcome))
            except BaseException as release_error:
                failed = effect_failure(exc)
                (exc if failed is None else failed.error).add_note(
                    f"releasing the claim also failed (not retried): {type(release_error).__name__}")
            raise
        return Result(response, code, replayed=False)

    async def _release(self, claimed: Claimed) -> None:
        async with self.transaction() as conn:
            await conn.run_sync(self._core.release, claimed)

    # --- retention -----------------------------------------------------------------------------------------------

    async def purge(self, older_than: timedelta, batch_size: int = 1000) -> int:
        """Delete records completed (or abandoned) longer than `older_than` ago, and processed messages as old,
        in batches of one transaction each, retried like `run`. A live in-flight claim is never touched."""
        total = 0
        for table, condition in self._core._purge_targets(older_than, batch_size):
            while True:
                batch = functools.partial(self._purge_batch, table, condition, batch_size)
                deleted = await acall_with_retry(self.retry, self.retry_cause, batch, self._core._count_retry)
                total += deleted
                if deleted < batch_size:
                    break
        return total

    async def _purge_batch(self, table: Table, condition: ColumnElement[bool], batch_size: int) -> int:
        async with self.transaction() as conn:
            return await conn.run_sync(self.backend.purge_batch, table, condition, batch_size)


async def _call(effect: AsyncEffect, conn: AsyncConnection, status: int) -> tuple[Any, int]:
    """Await the effect. Its error is marked as the effect's (EffectFailed, unwrapped by the retry loop), so a
    failing rollback after it cannot take its place; a cancellation is not an error and propagates as it is."""
    try:
        response = await effect(conn)
    except Exception as exc:
        raise EffectFailed(exc) from exc
    return reply(response, status)


def _sync(conn: object) -> AsyncConnection:
    if not isinstance(conn, AsyncConnection):
        raise AsyncMisuse(f"AsyncIdempotencyStore needs the AsyncConnection of `async with store.transaction()`, got"
                          f" {type(conn).__name__}; a sync Connection belongs to IdempotencyStore")
    return conn


async def _abort(conn: AsyncConnection, ending: AbstractContextManager[None], exc: BaseException) -> None:
    """Roll back after `exc` (an error, or the task's cancellation); if even that fails or is interrupted, discard
    the connection so the pool never hands out a connection in an unknown state."""
    try:
        await conn.run_sync(lambda _: ending.__exit__(type(exc), exc, exc.__traceback__))
    except BaseException:
        with contextlib.suppress(BaseException):
            await conn.invalidate()

