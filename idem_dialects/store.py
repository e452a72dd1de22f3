"""IdempotencyStore: the protocol's flows executed with plain calls, for sync code.

`SyncStore` is the sync store surface and its loop, written once over an `Executor` (`api.py`), which says how a
transaction begins and a statement runs on a connection: `IdempotencyStore` on an SQLAlchemy engine
(`EngineExecutor`), `DjangoStore` on Django's connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import URL, Connection

from . import dialects
from .api import Executor, StoreAPI
from .claims import Reply as Reply  # re-exported: its home before the flows were split by job
from .core import NO_PAYLOAD, Core
from .drivers import Driver
from .errors import AsyncMisuse
from .execution.sync import commit_native, execute_native, execute_sqlalchemy
from .fingerprint import Encoder
from .heartbeat import beating
from .ids import Identity, Origin
from .limits import DEFAULT_PACE, DEFAULT_RETENTION, OnInFlight
from .outcomes import Claimed, Delivery, Disposition, OnMismatch, Outcome, Result
from .retention import Stats
from .retry import RetryPolicy
from .steps import Begin, Catalog, Effect, Exec, Flow, Sleep, Statement, Statements, Step, Stepper, Transaction
from .storebase import (
    StatementHook,
    StoreBase,
    connect,
    owning_engine,
    refuse_async_effect,
    refuse_awaitable,
    statement_sql,
)
from .telemetry import MeterProvider, TracerProvider
from .url import target

T = TypeVar("T")
C = TypeVar("C")  # the connection a store's transactions (and so its effects) get


class SyncStore(StoreBase, Generic[C]):
    """The sync store surface (`api.StoreAPI`), written once over an `Executor`: the API, and the loop that executes
    the flows. `IdempotencyStore` is this on an `EngineExecutor`, `DjangoStore` on Django's connection."""

    engine: Engine

    def __init__(self, core: Core, executor: Executor[C], statement_hook: StatementHook | None = None) -> None:
        self._adopt(core)
        self.executor = executor
        self._hook = statement_hook
        self._execute_statement = executor.execute  # bound once: the loop's hottest call

    # --- schema --------------------------------------------------------------------------------------------------

    def create_tables(self, *, generations: bool = False) -> None:
        """Create the tables that do not exist yet (idempotent). `generations=True` also creates the previous
        generation's table where the backend can rotate generations (PostgreSQL; MySQL and MariaDB but Galera): then
        `purge` drops a whole generation once it is past retention instead of deleting its records row by row, and
        every claim reads that table too. Stores made before it existed do not read it: restart them before the first
        purge (docs: Retention and purge)."""
        self.drive(self._core.create_tables(generations))

    def drop_tables(self) -> None:
        self.drive(self._core.drop_tables())

    # --- the step-by-step API ------------------------------------------------------------------------------------

    def transaction(self, *, scope: str | None = None) -> AbstractContextManager[C]:
        """A connection in a transaction begun the way the engine needs; commits on success. `scope` (checked, not
        needed on one database) is what a sharded store routes by."""
        self._core.scope(scope)
        return self.begin(Begin.STORE)

    @contextmanager
    def begin(self, how: Begin = Begin.STORE) -> Iterator[C]:
        """A connection of the store's own in a transaction begun as `how` says, with what the store runs first (the
        backend's BEGIN, the server's features read once): what `transaction()` and every flow's transaction are."""
        with self.executor.transaction(how) as conn:
            self.drive(self._core.begin(how), conn)
            yield conn

    def begun(self, how: Begin, body: Flow[T]) -> Flow[T]:
        """`body` preceded by what begins a transaction `how` on one of `executor.transaction(how)`'s connections:
        for loops that drive flows on such a connection (the sharded store's)."""
        yield from self._core.begin(how)
        return (yield from body)

    def claim(self, conn: C, *, scope: str, operation: str, key: str, request: Any,
              lease: timedelta | None = None) -> Outcome:
        """Claim the key, or tell why not. Atomic by default; with `lease` the claim is meant to commit alone."""
        req = self.claims.request(scope, operation, key, request, lease)
        self._check(conn)
        return self.drive(self.claims.claim(req), conn)

    def complete(self, conn: C, claimed: Claimed, response: Any, status: int = 200) -> None:
        """Store the result in the caller's transaction, fenced by the claim token (LeaseLost if taken over)."""
        self.drive(self.claims.complete(claimed, response, status), conn)

    def release(self, conn: C, claimed: Claimed) -> bool:
        """Give up a claim that was not completed, so the next attempt may claim at once; False if not held."""
        return self.drive(self.claims.release(claimed), conn)

    def accept_message(self, conn: C, *, subscriber: str, message_id: str, payload: Any = NO_PAYLOAD) -> bool:
        """True the first time (subscriber, message_id) is seen, in the caller's transaction; False on redelivery.
        A redelivery whose payload differs from the first one's raises RequestMismatch."""
        flow = self._inbox.accept_message(subscriber, message_id, payload)
        self._check(conn)
        return self.drive(flow, conn)

    # --- the outbox --------------------------------------------------------------------------------------------

    def add_command(self, conn: C, destination: str, payload: Any, headers: Mapping[str, str] | None = None, *,
                    scope: str | None = None, origin: Identity | Origin | None = None,
                    sequence: int | None = None) -> str:
        """Write a command for another system into the outbox, in the transaction of `conn` (the effect's): it
        commits with the record and the business write, or not at all. Returns its id, stable across attempts
        (derived from the record and the command's sequence number: the effect's 1st command is 0, ...), which
        relays publish as the message id / deduplication header / Idempotency-Key. `payload`: bytes or a JSON
        value; `scope`: the command's ordering key (default: the record's scope, a consumer's subscriber).
        Outside an effect, give `origin` (the step-by-step API's Claimed) and `sequence`."""
        command = self._command(destination, payload, headers, scope, origin, sequence)
        self._check(conn)
        self.drive(self.outbox.add(command), conn)
        return command.id

    # --- the idempotent consumer -------------------------------------------------------------------------------

    def consume(self, *, subscriber: str, message_id: str, handler: Callable[[C], Any], payload: Any = NO_PAYLOAD,
                on_mismatch: OnMismatch = Disposition.DEAD_LETTER, retry: RetryPolicy | None = None,
                scope: str | None = None) -> Delivery:
        """Run `handler(conn)` and record (subscriber, message_id) in one transaction, once per message id.

        A redelivery (or a duplicate publish) of a message processed before returns a Delivery with
        `duplicate=True` and `Disposition.ACK` without calling the handler; one whose `payload` differs from the
        first one's gets the disposition `on_mismatch` chooses. Retried like `run`; the handler's error reaches the
        caller unchanged (nothing is recorded: the message is not processed). `scope`: the owner of what the
        handler writes, which a sharded store routes by (a message names none); checked, not needed on one
        database."""
        flow = self._inbox.consume(subscriber=subscriber, message_id=message_id, payload=payload,
                                   on_mismatch=on_mismatch, retry=retry)  # validates before the first connection
        self._core.scope(scope)
        refuse_async_effect(handler, "handler")
        return self.drive(flow, effect=handler)

    # --- the whole protocol in one call --------------------------------------------------------------------------

    def run(self, *, scope: str, operation: str, key: str, request: Any, effect: Callable[[C], Any],
            status: int = 200, lease: timedelta | None = None, retry: RetryPolicy | None = None,
            on_in_flight: OnInFlight = "wait") -> Result:
        """Claim, run `effect(conn)` and store its response once; replay it to every retry.

        Raises RequestMismatch, RequestInFlight, InvalidKey, or RetriesExhausted when retryable errors
        (busy, serialization failure, deadlock, lock timeout, lost connection, an exhausted connection pool) outlast
        the retry budget; ResponseTooLarge, never retried, for a response larger than the server takes.
        `effect` may return `Reply(response, status)` to store a status other than `status`.
        With `lease`, the claim is renewed while the effect runs (a third of the lease apart, on a connection of its
        own), so an effect that outlives its lease is not taken over; where the engine has one write lock (SQLite)
        the effect's transaction holds it, so no renewal is needed: a retry waits for the effect, then replays.
        `on_in_flight` says what an atomic run (no `lease`) does when another caller's claim of the same key is not
        committed yet (its effect still running): "wait" (the default) for that transaction to end, then replay its
        response (or claim, if it rolled back); "conflict": raise RequestInFlight at once (`retry_after` 1 s), using
        the engine's own lock-timeout / no-wait mechanism. On SQLite (one write lock) only a key a write transaction
        of this process holds is answered in flight; another waits. A leased run always answers RequestInFlight.
        """
        flow = self.claims.run(scope=scope, operation=operation, key=key, request=request, status=status,
                               lease=lease, retry=retry, on_in_flight=on_in_flight)  # validated before any SQL
        refuse_async_effect(effect)
        return self.drive(flow, effect=effect)

    # --- retention -----------------------------------------------------------------------------------------------

    def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
              progress: Callable[[str, int], None] | None = None, pace: float = DEFAULT_PACE) -> int:
        """Delete records completed (or abandoned, lease over) longer than `older_than` (default: the store's
        `retention`) ago, processed messages and published outbox commands as old, in batches of one transaction
        each, paced: batches fill at most `pace` of the purge's time (after a batch of t seconds it waits
        t (1/pace - 1); 1: no pauses), and a batch slower than 0.1 s makes the next one smaller, so traffic beside it
        keeps most of the database. A live in-flight claim is never touched. `progress(table, deleted)` is called
        after each batch."""
        return self.drive(self._retention.purge(older_than, batch_size, progress, pace))

    def stats(self) -> Stats:
        """The tables now: records by state (completed, in flight, expired lease), the oldest claim not completed,
        the records and messages past `retention` waiting for `purge`, and each table's size where the engine
        reports it (one read; no lock a claim waits for)."""
        return self.drive(self._retention.stats())

    # --- lifecycle -----------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Let go of what the store opened itself (the engine `from_url` created); a caller's engine is theirs."""
        self.executor.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- the loop ------------------------------------------------------------------------------------------------

    def drive(self, flow: Flow[T], conn: C | None = None, effect: Callable[[C], Any] | None = None) -> T:
        """Run `flow` to its end, each step executed here (how adapters such as the HTTP runner run their flows)."""
        stepper = Stepper(flow)
        while (step := stepper.next()) is not None:
            try:
                if type(step) is Exec:
                    hook = self._hook
                    if hook is None:
                        stepper.send(self._execute_statement(conn, step.statement, step.params))  # type: ignore[arg-type]
                        continue
                    sql = statement_sql(step, self.engine.dialect)
                    hook(sql, False)
                    stepper.send(self._execute_statement(conn, step.statement, step.params))  # type: ignore[arg-type]
                    hook(sql, True)
                else:
                    stepper.send(self._execute(step, conn, effect))
            except BaseException as exc:
                stepper.throw(exc)
        return stepper.value

    def _execute(self, step: Step, conn: C | None, effect: Callable[[C], Any] | None) -> Any:
        if type(step) is Effect:
            assert effect is not None, "a flow with an Effect step needs an effect"
            with beating(step.heartbeat, self.drive):  # renews a leased claim while the effect runs
                response = effect(conn)  # type: ignore[arg-type]
            refuse_awaitable(response)
            return response
        if type(step) is Transaction:
            # `begin`, inlined: its context manager is a dozen calls more per request. Nothing to shield from: a sync
            # call is not cancelled.
            with self.executor.transaction(step.begin) as c:
                self.drive(self._core.begin(step.begin), c)
                return self.drive(step.body, c, effect)
        if type(step) is Statements:
            return self.drive(step.body, conn)
        if type(step) is Catalog:
            return self.executor.catalog(conn, step.action)  # type: ignore[arg-type]
        assert type(step) is Sleep
        time.sleep(step.seconds)
        return None

    def _check(self, conn: C) -> None:
        """A caller's connection for the step-by-step API: allowed, and the features refined on first use."""
        self.executor.check(conn)
        if not self._core.refined:
            self.drive(self._core.refine(), conn)


class EngineExecutor:
    """The `Executor` on an SQLAlchemy engine: its pool's connections, SQLAlchemy's transaction on each, the store's
    statements on the DBAPI cursor in that transaction where the driver module runs them natively (else through
    `Connection.execute`)."""

    def __init__(self, engine: Engine, core: Core, *, driver: Driver | None, owns_engine: bool = False) -> None:
        self.engine, self._core, self._backend = engine, core, core.backend
        self.driver = driver  # None: statements through SQLAlchemy's `Connection.execute`
        self.owns_engine = owns_engine
        # The driver that begins and commits the store's transactions more cheaply than its DBAPI does (none: the
        # DBAPI's BEGIN before the first statement, SQLAlchemy's COMMIT).
        self._transactions = driver if driver is not None and driver.own_transactions_sync else None

    @contextmanager
    def transaction(self, begin: Begin) -> Iterator[Connection]:
        with connect(self.engine, self._backend) as conn:
            self._core.ready(conn)
            with self._backend.transaction(conn, begin):
                yield conn
                if self._transactions is not None:
                    commit_native(conn, self._backend, self._transactions)

    def execute(self, conn: Connection, statement: Statement, params: Mapping[str, Any]) -> Any:
        if self.driver is not None:
            return execute_native(conn, self._backend, statement, params, self._transactions)
        return execute_sqlalchemy(conn, statement, params)

    def catalog(self, conn: Connection, action: Callable[[Connection], T]) -> T:
        return action(conn)

    def check(self, conn: Connection) -> None:
        self._core.checked(conn)

    def close(self) -> None:
        if self.owns_engine:
            self.engine.dispose()


class IdempotencyStore(SyncStore[Connection]):
    """Idempotency records for one database. Thread-safe; share one per engine.

    A context manager: `close()` (or leaving the `with` block) disposes of an engine the store created itself
    (`from_url`) and leaves an engine the caller passed in alone. Metrics and spans go to OpenTelemetry's global
    providers unless `meter_provider` / `tracer_provider` name others (the API's no-op one turns a signal off).

    The store runs its own statements (claim, read, complete, release, renew, purge) on the DBAPI cursor, compiled
    once, in the transaction SQLAlchemy holds: SQLAlchemy's cursor events do not see them, the store's own span and
    metrics do. `cursor_events=True` runs them through `Connection.execute` instead, for users whose tooling listens
    to those events (OpenTelemetry's SQLAlchemy instrumentation, statement counters). `statement_hook(sql, done)`, if
    given, is called with each of those statements' SQL (never their parameters) before and after it runs, either
    way: for tests and tracing. The effect always runs on SQLAlchemy's `Connection`."""

    executor: EngineExecutor

    def __init__(self, engine: Engine, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None,
                 encoder: Encoder | None = None, retention: timedelta = DEFAULT_RETENTION,
                 tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None,
                 cursor_events: bool = False, statement_hook: StatementHook | None = None) -> None:
        if getattr(engine.dialect, "is_async", False):  # an AsyncEngine's sync facade, or an asyncio-only driver
            raise AsyncMisuse(f"IdempotencyStore needs a sync SQLAlchemy Engine, got {type(engine).__name__} on an"
                              " asyncio driver; use idem_dialects.AsyncIdempotencyStore for an AsyncEngine")
        self.engine = engine
        self.cursor_events = cursor_events
        core = Core(engine, table_prefix, retry, encoder, retention, tracer_provider=tracer_provider,
                    meter_provider=meter_provider)
        driver = dialects.driver(type(core.backend), engine.dialect.driver)
        native = not cursor_events and driver is not None and driver.native
        super().__init__(core, EngineExecutor(engine, core, driver=driver if native else None), statement_hook)

    @classmethod
    def from_url(cls, url: str | URL, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None,
                 encoder: Encoder | None = None, retention: timedelta = DEFAULT_RETENTION,
                 tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None,
                 cursor_events: bool = False, statement_hook: StatementHook | None = None,
                 **engine_options: Any) -> IdempotencyStore:
        """Build the engine (options go to `create_engine`) and the backend its dialect name selects."""
        found = target(url)
        if found.asyncio_only:
            raise AsyncMisuse(f"{found.drivername} is an asyncio driver: use"
                              f" idem_dialects.AsyncIdempotencyStore.from_url for it, or a sync driver here")
        engine = found.create_engine(**engine_options)
        store = owning_engine(lambda: cls(engine, table_prefix=table_prefix, retry=retry, encoder=encoder,
                                          retention=retention, tracer_provider=tracer_provider,
                                          meter_provider=meter_provider, cursor_events=cursor_events,
                                          statement_hook=statement_hook),
                              engine.dispose)
        store.executor.owns_engine = True
        return store

    def __repr__(self) -> str:
        return f"IdempotencyStore({self.engine.url.render_as_string()!r}, table_prefix={self.table_prefix!r})"


if TYPE_CHECKING:  # mypy holds each class against its declared surface (api.py)
    def _surface(it: IdempotencyStore) -> StoreAPI[Connection]:
        return it

    def _executor(it: EngineExecutor) -> Executor[Connection]:
        return it
