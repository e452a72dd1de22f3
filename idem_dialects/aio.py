"""AsyncIdempotencyStore: the protocol's flows (`claims.py`, `inbox.py`, `retention.py`) awaited, for asyncio code.

No second copy of the protocol: the flows are the sync store's. Their statements and COMMIT run on the async driver's
own API (`execution.aio`): no greenlet hop per statement. SQLAlchemy's greenlet bridge is crossed twice per
transaction, to check a connection out and begin, and to end SQLAlchemy's transaction and give the connection back,
where SQLAlchemy's pool and transaction live.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from datetime import timedelta
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import dialects, steps
from .api import AsyncExecutor, AsyncStoreAPI
from .core import NO_PAYLOAD, Core
from .errors import AsyncMisuse
from .execution.aio import InTransaction, execute_async, statements_async, to_completion
from .fingerprint import Encoder
from .heartbeat import beating_async
from .ids import Identity, Origin
from .limits import DEFAULT_PACE, DEFAULT_RETENTION, OnInFlight
from .outcomes import Claimed, Delivery, Disposition, OnMismatch, Outcome, Result
from .retention import Stats
from .retry import RetryPolicy
from .steps import Begin, Catalog, Effect, Exec, Flow, Sleep, Statement, Statements, Step, Stepper, Transaction
from .storebase import StatementHook, StoreBase, connect, owning_engine, refuse_sync_effect, statement_sql
from .telemetry import MeterProvider, TracerProvider
from .url import async_drivers_hint, target

if TYPE_CHECKING:
    from .drivers import Driver

T = TypeVar("T")
C = TypeVar("C")  # the connection a store's transactions (and so its effects) get
AsyncEffect = Callable[[AsyncConnection], Awaitable[Any]]


class AsyncStore(StoreBase, Generic[C]):
    """The async store surface (`api.AsyncStoreAPI`), written once over an `AsyncExecutor`: the sync store's API,
    awaited, and the loop that awaits the flows. `AsyncIdempotencyStore` is this on an `AsyncEngineExecutor`."""

    engine: AsyncEngine

    def __init__(self, core: Core, executor: AsyncExecutor[C], statement_hook: StatementHook | None = None) -> None:
        self._adopt(core)
        self.executor = executor
        self._hook = statement_hook
        self._execute_statement = executor.execute  # bound once: the loop's hottest call
        # An executor may run a `Statements` step where the connection lives (`AsyncEngineExecutor.statements`),
        # handing back what is left of it; else, or for that rest, statement by statement here.
        self._statements: Callable[[C, Flow[Any], StatementHook | None], Awaitable[Flow[Any]]] | None = getattr(
            executor, "statements", None)
        core.statement_steps = self._statements is not None

    # --- schema --------------------------------------------------------------------------------------------------

    async def create_tables(self, *, generations: bool = False) -> None:
        """What the sync store's `create_tables` does, awaited."""
        await self.drive(self._core.create_tables(generations))

    async def drop_tables(self) -> None:
        await self.drive(self._core.drop_tables())

    # --- the step-by-step API ------------------------------------------------------------------------------------

    def transaction(self, *, scope: str | None = None) -> AbstractAsyncContextManager[C]:
        """A connection in a transaction begun the way the engine needs; commits on success, rolls back on an
        error or cancellation (or discards the connection if that fails). `scope` as for the sync store."""
        self._core.scope(scope)
        return self.begin(Begin.STORE)

    @asynccontextmanager
    async def begin(self, how: Begin = Begin.STORE) -> AsyncIterator[C]:
        """What the sync store's `begin` does, awaited."""
        async with self.executor.transaction(how) as conn:
            await self.drive(self._core.begin(how), conn)
            yield conn

    def begun(self, how: Begin, body: Flow[T]) -> Flow[T]:
        """`body` preceded by what begins a transaction `how` on one of `executor.transaction(how)`'s connections:
        for drivers looping over `drive` (the sharded store's too). On the request path of an executor that runs a
        `Statements` step whole (aiosqlite), its BEGIN, which takes no lock, goes in the claim's hop; refined, as
        `begin` then holds statements only, which a hop takes."""
        if how is Begin.CLAIM and self._statements is not None and self._core.refined:
            return _begun(self._core.begin(how), body)
        return _after(self._core.begin(how), body)

    async def claim(self, conn: C, *, scope: str, operation: str, key: str, request: Any,
                    lease: timedelta | None = None) -> Outcome:
        """Claim the key, or tell why not. Atomic by default; with `lease` the claim is meant to commit alone."""
        req = self.claims.request(scope, operation, key, request, lease)
        await self._check(conn)
        return await self.drive(self.claims.claim(req), conn)

    async def complete(self, conn: C, claimed: Claimed, response: Any, status: int = 200) -> None:
        """Store the result in the caller's transaction, fenced by the claim token (LeaseLost if taken over)."""
        flow = self.claims.complete(claimed, response, status)
        await self._check(conn)
        await self.drive(flow, conn)

    async def release(self, conn: C, claimed: Claimed) -> bool:
        """Give up a claim that was not completed, so the next attempt may claim at once; False if not held."""
        await self._check(conn)
        return await self.drive(self.claims.release(claimed), conn)

    async def accept_message(self, conn: C, *, subscriber: str, message_id: str, payload: Any = NO_PAYLOAD) -> bool:
        """True the first time (subscriber, message_id) is seen, in the caller's transaction; False on redelivery.
        A redelivery whose payload differs from the first one's raises RequestMismatch."""
        flow = self._inbox.accept_message(subscriber, message_id, payload)
        await self._check(conn)
        return await self.drive(flow, conn)

    # --- the outbox --------------------------------------------------------------------------------------------

    async def add_command(self, conn: C, destination: str, payload: Any, headers: Mapping[str, str] | None = None,
                          *, scope: str | None = None, origin: Identity | Origin | None = None,
                          sequence: int | None = None) -> str:
        """What the sync `add_command` does, awaited, in the transaction of `conn` (the effect's AsyncConnection)."""
        command = self._command(destination, payload, headers, scope, origin, sequence)
        await self._check(conn)
        await self.drive(self.outbox.add(command), conn)
        return command.id

    # --- the idempotent consumer -------------------------------------------------------------------------------

    async def consume(self, *, subscriber: str, message_id: str, handler: Callable[[C], Awaitable[Any]],
                      payload: Any = NO_PAYLOAD, on_mismatch: OnMismatch = Disposition.DEAD_LETTER,
                      retry: RetryPolicy | None = None, scope: str | None = None) -> Delivery:
        """Await `handler(conn)` and record (subscriber, message_id) in one transaction, once per message id.

        What the sync `consume` does, awaited; `handler` is an `async def` taking the AsyncConnection."""
        flow = self._inbox.consume(subscriber=subscriber, message_id=message_id, payload=payload,
                                   on_mismatch=on_mismatch, retry=retry)  # validates before the first connection
        self._core.scope(scope)
        refuse_sync_effect(handler, "handler")
        return await self.drive(flow, effect=handler)

    # --- the whole protocol in one call --------------------------------------------------------------------------

    async def run(self, *, scope: str, operation: str, key: str, request: Any, effect: Callable[[C], Awaitable[Any]],
                  status: int = 200, lease: timedelta | None = None, retry: RetryPolicy | None = None,
                  on_in_flight: OnInFlight = "wait") -> Result:
        """Claim, await `effect(conn)` and store its response once; replay it to every retry.

        `effect` is an `async def` taking the AsyncConnection (a sync function is refused with AsyncMisuse before
        any SQL). Raises what the sync `run` raises. A cancelled task leaves no claim behind beyond its lease: an
        atomic claim rolls back with the transaction, a leased one is released. A leased claim is renewed while the
        effect runs (a task), and `on_in_flight` is the sync `run`'s."""
        flow = self.claims.run(scope=scope, operation=operation, key=key, request=request, status=status,
                               lease=lease, retry=retry, on_in_flight=on_in_flight)  # validated before any SQL
        refuse_sync_effect(effect)
        return await self.drive(flow, effect=effect)

    # --- retention -----------------------------------------------------------------------------------------------

    async def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
                    progress: Callable[[str, int], None] | None = None, pace: float = DEFAULT_PACE) -> int:
        """Delete records completed (or abandoned, lease over) longer than `older_than` (default: the store's
        `retention`) ago, processed messages and published outbox commands as old, in batches of one transaction
        each, paced as the sync store's (`pace`: the share of its time spent in batches). A live in-flight claim is
        never touched. `progress(table, deleted)` is called after each batch."""
        return await self.drive(self._retention.purge(older_than, batch_size, progress, pace))

    async def stats(self) -> Stats:
        """The tables now: records by state (completed, in flight, expired lease), the oldest claim not completed,
        the records and messages past `retention` waiting for `purge`, and each table's size where the engine
        reports it (one read; no lock a claim waits for)."""
        return await self.drive(self._retention.stats())

    # --- lifecycle -----------------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Let go of what the store opened itself (the engine `from_url` created); a caller's engine is theirs."""
        await self.executor.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # --- the loop ------------------------------------------------------------------------------------------------

    async def drive(self, flow: Flow[T], conn: C | None = None,
                    effect: Callable[[C], Awaitable[Any]] | None = None) -> T:
        """Run `flow` to its end, each step awaited here (how adapters such as the HTTP runner run their flows)."""
        # The request path's steps are handled here, tested by exact type (no subclass of a step exists; an isinstance
        # chain is a call per test) and awaited without a coroutine between: each coroutine on the chain is a call
        # more whenever a statement waits for the server.
        stepper = Stepper(flow)
        while (step := stepper.next()) is not None:
            try:
                if type(step) is Exec:
                    assert conn is not None, "a statement step needs a transaction"
                    hook = self._hook
                    if hook is None:
                        stepper.send(await self._execute_statement(conn, step.statement, step.params))
                        continue
                    sql = statement_sql(step, self._core.engine.dialect)
                    hook(sql, False)
                    stepper.send(await self._execute_statement(conn, step.statement, step.params))
                    hook(sql, True)
                elif type(step) is Transaction:
                    if step.shielded:
                        # A release must finish even if the task is cancelled again meanwhile (the lease holds the
                        # key): the transaction, unshielded, in a drive of its own that to_completion carries through.
                        alone = steps.transaction(step.body, step.begin)
                        stepper.send(await to_completion(self.drive(alone, conn, effect)))
                        continue
                    async with self.executor.transaction(step.begin) as held:  # `begin` inlined: a context less
                        value = await self.drive(self.begun(step.begin, step.body), held, effect)
                    stepper.send(value)
                elif type(step) is Effect:
                    assert effect is not None, "a flow with an Effect step needs an effect"
                    if step.heartbeat is None:
                        stepper.send(await effect(conn))  # type: ignore[arg-type]
                    else:
                        async with beating_async(step.heartbeat, self.drive):  # renews the leased claim meanwhile
                            stepper.send(await effect(conn))  # type: ignore[arg-type]
                elif type(step) is Statements:
                    assert conn is not None, "a statement step needs a transaction"
                    run = self._statements
                    rest = step.body if run is None else await run(conn, step.body, self._hook)
                    stepper.send(await self.drive(rest, conn))  # this loop alone runs statements one by one
                else:
                    stepper.send(await self._execute(step, conn))
            except BaseException as exc:
                stepper.throw(exc)
        return stepper.value

    async def _execute(self, step: Step, conn: C | None) -> Any:
        """The steps off the request path."""
        if isinstance(step, Catalog):
            assert conn is not None, "a schema step needs a transaction"
            return await self.executor.catalog(conn, step.action)
        assert isinstance(step, Sleep), f"not a step: {step!r}"
        await asyncio.sleep(step.seconds)
        return None

    async def _check(self, conn: C) -> None:
        """A caller's connection for the step-by-step API: allowed, and the features refined on first use."""
        self.executor.check(conn)
        if not self._core.refined:
            await self.drive(self._core.refine(), conn)


class AsyncEngineExecutor:
    """The `AsyncExecutor` on an SQLAlchemy AsyncEngine: its pool's connections and SQLAlchemy's transaction on each
    (one greenlet to check a connection out and begin, one to end the transaction and give the connection back),
    the store's statements and COMMIT on the async driver's own API where its driver module has a native form."""

    def __init__(self, engine: AsyncEngine, core: Core, *, driver: Driver | None, owns_engine: bool = False) -> None:
        self.engine, self._core, self._backend = engine, core, core.backend
        self.driver = driver  # None: statements through SQLAlchemy (`run_sync`)
        self.owns_engine = owns_engine
        # The driver whose COMMIT the store sends on its own API (none: SQLAlchemy's commit sends it).
        self._committer = driver if driver is not None and driver.commits_natively else None
        # A driver whose connection lives on a thread of its own (aiosqlite) runs a `Statements` step there whole.
        self.statements = self._in_thread if driver is not None and driver.threaded else None
        # One shared connection (SQLite :memory:): transactions take turns on the event loop instead of a thread lock.
        self._turns = None if core.features.concurrent_connections else asyncio.Lock()

    def transaction(self, begin: Begin) -> AbstractAsyncContextManager[AsyncConnection]:
        return InTransaction(self.engine, partial(self._begin, begin), self._backend, self._committer, self._turns)

    def execute(self, conn: AsyncConnection, statement: Statement, params: Mapping[str, Any]) -> Awaitable[Any]:
        return execute_async(conn, self._backend, self.driver, statement, params)  # not a coroutine more to await

    def _in_thread(self, conn: AsyncConnection, body: Flow[T], hook: StatementHook | None) -> Awaitable[Flow[T]]:
        assert self.driver is not None
        return statements_async(conn, self._backend, self.driver, body, hook)  # not a coroutine more to await

    async def catalog(self, conn: AsyncConnection, action: Callable[[Connection], T]) -> T:
        return await conn.run_sync(action)

    def check(self, conn: AsyncConnection) -> None:
        sync = _own(conn).sync_connection
        assert sync is not None
        self._core.checked(sync)  # no round trip: attributes of the connection only

    async def close(self) -> None:
        if self.owns_engine:
            await self.engine.dispose()

    def _begin(self, begin: Begin) -> tuple[Connection, AbstractContextManager[Any]]:
        """In SQLAlchemy's greenlet: a connection (`connect`: failing to get one raises what the backend's classifier
        makes of it), checked, in a transaction begun the backend's way."""
        conn = connect(self.engine.sync_engine, self._backend)  # asyncpg's OSError and own errors classified alike
        try:
            self._core.ready(conn)
            ending = self._backend.transaction(conn, begin)
            ending.__enter__()
        except BaseException:
            conn.close()
            raise
        return conn, ending


class AsyncIdempotencyStore(AsyncStore[AsyncConnection]):
    """Idempotency records for one database, for asyncio code: the sync store's API, awaited. Share one per engine.

    `async with store:` (or `await store.close()`) disposes of an engine the store created (`from_url`) and leaves
    an engine the caller passed in alone. Telemetry providers, `cursor_events` and `statement_hook` as for
    IdempotencyStore (a driver without a native async form, such as aioodbc, always runs the store's statements
    through SQLAlchemy)."""

    executor: AsyncEngineExecutor

    def __init__(self, engine: AsyncEngine, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None,
                 encoder: Encoder | None = None, retention: timedelta = DEFAULT_RETENTION,
                 tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None,
                 cursor_events: bool = False, statement_hook: StatementHook | None = None) -> None:
        if not isinstance(engine, AsyncEngine):
            raise AsyncMisuse(f"AsyncIdempotencyStore needs a sqlalchemy.ext.asyncio.AsyncEngine, got"
                              f" {type(engine).__name__}; use IdempotencyStore for a sync Engine, or build one with"
                              " create_async_engine on an async driver")
        self.engine = engine
        self.cursor_events = cursor_events
        core = Core(engine.sync_engine, table_prefix, retry, encoder, retention, tracer_provider=tracer_provider,
                    meter_provider=meter_provider)
        driver = dialects.driver(type(core.backend), engine.sync_engine.dialect.driver)
        native = driver is not None and driver.native_async and not cursor_events
        super().__init__(core, AsyncEngineExecutor(engine, core, driver=driver if native else None), statement_hook)

    @classmethod
    def from_url(cls, url: str | URL, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None,
                 encoder: Encoder | None = None, retention: timedelta = DEFAULT_RETENTION,
                 tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None,
                 cursor_events: bool = False, statement_hook: StatementHook | None = None,
                 **engine_options: Any) -> AsyncIdempotencyStore:
        """Build the AsyncEngine (options go to `create_async_engine`) and the backend its dialect name selects."""
        found = target(url)
        if not found.async_capable:
            raise AsyncMisuse(f"{found.drivername} is not an asyncio driver: use IdempotencyStore.from_url for it,"
                              f" or an async driver here ({async_drivers_hint(found.backend)})")
        engine = found.create_async_engine(**engine_options)
        store = owning_engine(lambda: cls(engine, table_prefix=table_prefix, retry=retry, encoder=encoder,
                                          retention=retention, tracer_provider=tracer_provider,
                                          meter_provider=meter_provider, cursor_events=cursor_events,
                                          statement_hook=statement_hook),
                              engine.sync_engine.dispose)
        store.executor.owns_engine = True
        return store

    def __repr__(self) -> str:
        return f"AsyncIdempotencyStore({self.engine.url.render_as_string()!r}, table_prefix={self.table_prefix!r})"


def _begun(begin: Flow[None], body: Flow[T]) -> Flow[T]:
    """`body` after `begin`, the statements that begin its transaction: sent in the same step as the body's first if
    that is a `Statements` step (one hop where the executor runs such steps whole), else before that step."""
    stepper = Stepper(body)
    step = stepper.next()
    if type(step) is Statements:
        step = Statements(_after(begin, step.body))
    else:
        try:
            yield from begin
        except BaseException:
            body.close()
            raise
    while step is not None:
        try:
            stepper.send((yield step))
        except BaseException as exc:
            stepper.throw(exc)
        step = stepper.next()
    return stepper.value


def _after(first: Flow[None], then: Flow[T]) -> Flow[T]:
    yield from first
    return (yield from then)


def _own(conn: object) -> AsyncConnection:
    if not isinstance(conn, AsyncConnection):
        raise AsyncMisuse(f"AsyncIdempotencyStore needs the AsyncConnection of `async with store.transaction()`, got"
                          f" {type(conn).__name__}; a sync Connection belongs to IdempotencyStore")
    return conn


if TYPE_CHECKING:  # mypy holds each class against its declared surface (api.py)
    def _surface(it: AsyncIdempotencyStore) -> AsyncStoreAPI[AsyncConnection]:
        return it

    def _executor(it: AsyncEngineExecutor) -> AsyncExecutor[AsyncConnection]:
        return it
