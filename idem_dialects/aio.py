"""AsyncIdempotencyStore: the protocol's flows (`protocol.py`) awaited, for asyncio code.

No second copy of the protocol: the flows are the sync store's, and their SQL steps (the backends' sync code) run on
the async driver through SQLAlchemy's greenlet bridge (`AsyncConnection.run_sync`). Only what must await is written
here: opening and ending transactions, awaiting the effect, sleeping between retries, and finishing a release while
the task is being cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from datetime import timedelta
from types import TracebackType
from typing import Any, Self, TypeVar

from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .errors import AsyncMisuse
from .fingerprint import Encoder
from .heartbeat import beating_async
from .limits import OnInFlight
from .outcomes import Claimed, Delivery, Disposition, Outcome, Result
from .protocol import NO_PAYLOAD, Core, OnMismatch
from .retention import DEFAULT_RETENTION, Stats
from .retry import RetryPolicy
from .steps import Begin, Effect, Flow, Sql, Step, Stepper, Transaction, execute_unlogged
from .storebase import StoreBase, owning_engine, refuse_sync_effect
from .telemetry import MeterProvider, TracerProvider
from .url import async_drivers_hint, target

T = TypeVar("T")
AsyncEffect = Callable[[AsyncConnection], Awaitable[Any]]


class AsyncIdempotencyStore(StoreBase):
    """Idempotency records for one database, for asyncio code: the sync store's API, awaited. Share one per engine.

    `async with store:` (or `await store.close()`) disposes of an engine the store created (`from_url`) and leaves
    an engine the caller passed in alone. Telemetry providers as for IdempotencyStore."""

    def __init__(self, engine: AsyncEngine, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None,
                 encoder: Encoder | None = None, retention: timedelta = DEFAULT_RETENTION,
                 tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None) -> None:
        if not isinstance(engine, AsyncEngine):
            raise AsyncMisuse(f"AsyncIdempotencyStore needs a sqlalchemy.ext.asyncio.AsyncEngine, got"
                              f" {type(engine).__name__}; use IdempotencyStore for a sync Engine, or build one with"
                              " create_async_engine on an async driver")
        self.engine = engine
        self._adopt(Core(engine.sync_engine, table_prefix, retry, encoder, retention, tracer_provider=tracer_provider,
                         meter_provider=meter_provider))
        # One shared connection (SQLite :memory:): transactions take turns on the event loop instead of a thread lock.
        self._turns = None if self.features.concurrent_connections else asyncio.Lock()

    @classmethod
    def from_url(cls, url: str | URL, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None,
                 encoder: Encoder | None = None, retention: timedelta = DEFAULT_RETENTION,
                 tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None,
                 **engine_options: Any) -> AsyncIdempotencyStore:
        """Build the AsyncEngine (options go to `create_async_engine`) and the backend its dialect name selects."""
        found = target(url)
        if not found.async_capable:
            raise AsyncMisuse(f"{found.drivername} is not an asyncio driver: use IdempotencyStore.from_url for it,"
                              f" or an async driver here ({async_drivers_hint(found.backend)})")
        engine = found.create_async_engine(**engine_options)
        return owning_engine(lambda: cls(engine, table_prefix=table_prefix, retry=retry, encoder=encoder,
                                         retention=retention, tracer_provider=tracer_provider,
                                         meter_provider=meter_provider),
                             engine.sync_engine.dispose)

    async def close(self) -> None:
        """Dispose of the engine's connections if this store created the engine; a caller's engine is theirs."""
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
        await self.drive(self.core.create_tables())

    async def drop_tables(self) -> None:
        await self.drive(self.core.drop_tables())

    # --- the step-by-step API ------------------------------------------------------------------------------------

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A connection in a transaction begun the way the engine needs; commits on success, rolls back on an
        error or cancellation (or discards the connection if that fails)."""
        return self._transaction(Begin.STORE)

    async def claim(self, conn: AsyncConnection, *, scope: str, operation: str, key: str, request: Any,
                    lease: timedelta | None = None) -> Outcome:
        """Claim the key, or tell why not. Atomic by default; with `lease` the claim is meant to commit alone."""
        req = self.core.request(scope, operation, key, request, lease)
        await _own(conn).run_sync(self.core.checked)
        return await self.drive(self.core.claim(req), conn)

    async def complete(self, conn: AsyncConnection, claimed: Claimed, response: Any, status: int = 200) -> None:
        """Store the result in the caller's transaction, fenced by the claim token (LeaseLost if taken over)."""
        await self.drive(self.core.complete(claimed, response, status), _own(conn))

    async def release(self, conn: AsyncConnection, claimed: Claimed) -> bool:
        """Give up a claim that was not completed, so the next attempt may claim at once; False if not held."""
        return await self.drive(self.core.release(claimed), _own(conn))

    async def accept_message(self, conn: AsyncConnection, *, subscriber: str, message_id: str,
                             payload: Any = NO_PAYLOAD) -> bool:
        """True the first time (subscriber, message_id) is seen, in the caller's transaction; False on redelivery.
        A redelivery whose payload differs from the first one's raises RequestMismatch."""
        flow = self.core.accept_message(subscriber, message_id, payload)
        await _own(conn).run_sync(self.core.checked)
        return await self.drive(flow, conn)

    # --- the idempotent consumer -------------------------------------------------------------------------------

    async def consume(self, *, subscriber: str, message_id: str, handler: AsyncEffect, payload: Any = NO_PAYLOAD,
                      on_mismatch: OnMismatch = Disposition.DEAD_LETTER, retry: RetryPolicy | None = None) -> Delivery:
        """Await `handler(conn)` and record (subscriber, message_id) in one transaction, once per message id.

        What the sync `consume` does, awaited; `handler` is an `async def` taking the AsyncConnection."""
        flow = self.core.consume(subscriber=subscriber, message_id=message_id, payload=payload,
                                 on_mismatch=on_mismatch, retry=retry)  # validates before the first connection
        refuse_sync_effect(handler, "handler")
        return await self.drive(flow, effect=handler)

    # --- the whole protocol in one call --------------------------------------------------------------------------

    async def run(self, *, scope: str, operation: str, key: str, request: Any, effect: AsyncEffect,
                  status: int = 200, lease: timedelta | None = None, retry: RetryPolicy | None = None,
                  on_in_flight: OnInFlight = "wait") -> Result:
        """Claim, await `effect(conn)` and store its response once; replay it to every retry.

        `effect` is an `async def` taking the AsyncConnection (a sync function is refused with AsyncMisuse before
        any SQL). Raises what the sync `run` raises. A cancelled task leaves no claim behind beyond its lease: an
        atomic claim rolls back with the transaction, a leased one is released. A leased claim is renewed while the
        effect runs (a task), and `on_in_flight` is the sync `run`'s."""
        flow = self.core.run(scope=scope, operation=operation, key=key, request=request, status=status,
                              lease=lease, retry=retry, on_in_flight=on_in_flight)  # validated before any SQL
        refuse_sync_effect(effect)
        return await self.drive(flow, effect=effect)

    # --- retention -----------------------------------------------------------------------------------------------

    async def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
                    progress: Callable[[str, int], None] | None = None) -> int:
        """Delete records completed (or abandoned, lease over) longer than `older_than` (default: the store's
        `retention`) ago, and processed messages as old, in batches of one transaction each. A live in-flight claim
        is never touched. `progress(table, deleted)` is called after each batch."""
        return await self.drive(self.core.purge(older_than, batch_size, progress))

    async def stats(self) -> Stats:
        """The tables now: records by state (completed, in flight, expired lease), the oldest claim not completed,
        the records and messages past `retention` waiting for `purge`, and each table's size where the engine
        reports it (one read; no lock a claim waits for)."""
        return await self.drive(self.core.stats())

    # --- the loop ------------------------------------------------------------------------------------------------

    async def drive(self, flow: Flow[T], conn: AsyncConnection | None = None,
                     effect: AsyncEffect | None = None) -> T:
        """Run `flow` to its end, each step awaited here (how adapters such as the HTTP runner run their flows)."""
        stepper = Stepper(flow)
        while (step := stepper.next()) is not None:
            try:
                stepper.send(await self._execute(step, conn, effect))
            except BaseException as exc:
                stepper.throw(exc)
        return stepper.value

    async def _execute(self, step: Step, conn: AsyncConnection | None, effect: AsyncEffect | None) -> Any:
        if isinstance(step, Sql):
            assert conn is not None, "a statement step needs a transaction"
            return await conn.run_sync(execute_unlogged, step.fn)
        if isinstance(step, Effect):
            assert effect is not None, "a flow with an Effect step needs an effect"
            async with beating_async(step.heartbeat, self.drive):  # renews a leased claim while the effect runs
                return await effect(conn)  # type: ignore[arg-type]
        if isinstance(step, Transaction):
            body = self._in_transaction(step, effect)
            # A release must finish even if the task is cancelled again meanwhile (the lease would hold the key).
            return await (asyncio.shield(body) if step.shielded else body)
        await asyncio.sleep(step.seconds)
        return None

    async def _in_transaction(self, step: Transaction, effect: AsyncEffect | None) -> Any:
        async with self._transaction(step.begin) as conn:
            return await self.drive(step.body, conn, effect)

    @asynccontextmanager
    async def _transaction(self, begin: Begin) -> AsyncIterator[AsyncConnection]:
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

    def _begin(self, conn: Connection, begin: Begin) -> AbstractContextManager[None]:
        backend = self.backend
        self.core.ready(conn)
        ending = (backend.claim_transaction if begin is Begin.CLAIM else backend.transaction)(conn)
        ending.__enter__()
        return ending


def _own(conn: object) -> AsyncConnection:
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
