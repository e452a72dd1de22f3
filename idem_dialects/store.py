"""IdempotencyStore: the protocol's flows (`protocol.py`) executed with plain calls, for sync code."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from types import TracebackType
from typing import Any, Self, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import URL, Connection

from .errors import AsyncMisuse
from .fingerprint import Encoder
from .heartbeat import beating
from .limits import OnInFlight
from .outcomes import Claimed, Delivery, Disposition, Outcome, Result
from .protocol import NO_PAYLOAD, Core, OnMismatch
from .protocol import Reply as Reply  # re-exported: its home before the async store shared it
from .retention import DEFAULT_RETENTION, Stats
from .retry import RetryPolicy
from .steps import Begin, Effect, Flow, Sql, Step, Stepper, Transaction, execute_unlogged
from .storebase import StoreBase, owning_engine, refuse_async_effect, refuse_awaitable
from .telemetry import MeterProvider, TracerProvider
from .url import target

T = TypeVar("T")
SyncEffect = Callable[[Connection], Any]


class IdempotencyStore(StoreBase):
    """Idempotency records for one database. Thread-safe; share one per engine.

    A context manager: `close()` (or leaving the `with` block) disposes of an engine the store created itself
    (`from_url`) and leaves an engine the caller passed in alone. Metrics and spans go to OpenTelemetry's global
    providers unless `meter_provider` / `tracer_provider` name others (the API's no-op one turns a signal off)."""

    def __init__(self, engine: Engine, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None,
                 encoder: Encoder | None = None, retention: timedelta = DEFAULT_RETENTION,
                 tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None) -> None:
        if getattr(engine.dialect, "is_async", False):  # an AsyncEngine's sync facade, or an asyncio-only driver
            raise AsyncMisuse(f"IdempotencyStore needs a sync SQLAlchemy Engine, got {type(engine).__name__} on an"
                              " asyncio driver; use idem_dialects.AsyncIdempotencyStore for an AsyncEngine")
        self.engine = engine
        self._adopt(Core(engine, table_prefix, retry, encoder, retention, tracer_provider=tracer_provider,
                         meter_provider=meter_provider))

    @classmethod
    def from_url(cls, url: str | URL, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None,
                 encoder: Encoder | None = None, retention: timedelta = DEFAULT_RETENTION,
                 tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None,
                 **engine_options: Any) -> IdempotencyStore:
        """Build the engine (options go to `create_engine`) and the backend its dialect name selects."""
        found = target(url)
        if found.asyncio_only:
            raise AsyncMisuse(f"{found.drivername} is an asyncio driver: use"
                              f" idem_dialects.AsyncIdempotencyStore.from_url for it, or a sync driver here")
        engine = found.create_engine(**engine_options)
        return owning_engine(lambda: cls(engine, table_prefix=table_prefix, retry=retry, encoder=encoder,
                                         retention=retention, tracer_provider=tracer_provider,
                                         meter_provider=meter_provider),
                             engine.dispose)

    def close(self) -> None:
        """Dispose of the engine's connections if this store created the engine; a caller's engine is theirs."""
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"IdempotencyStore({self.engine.url.render_as_string()!r}, table_prefix={self.table_prefix!r})"

    # --- schema --------------------------------------------------------------------------------------------------

    def create_tables(self) -> None:
        self.drive(self.core.create_tables())

    def drop_tables(self) -> None:
        self.drive(self.core.drop_tables())

    # --- the step-by-step API ------------------------------------------------------------------------------------

    def transaction(self) -> AbstractContextManager[Connection]:
        """A connection in a transaction begun the way the engine needs; commits on success."""
        return self._transaction(Begin.STORE)

    def claim(self, conn: Connection, *, scope: str, operation: str, key: str, request: Any,
              lease: timedelta | None = None) -> Outcome:
        """Claim the key, or tell why not. Atomic by default; with `lease` the claim is meant to commit alone."""
        req = self.core.request(scope, operation, key, request, lease)
        self.core.checked(conn)
        return self.drive(self.core.claim(req), conn)

    def complete(self, conn: Connection, claimed: Claimed, response: Any, status: int = 200) -> None:
        """Store the result in the caller's transaction, fenced by the claim token (LeaseLost if taken over)."""
        self.drive(self.core.complete(claimed, response, status), conn)

    def release(self, conn: Connection, claimed: Claimed) -> bool:
        """Give up a claim that was not completed, so the next attempt may claim at once; False if not held."""
        return self.drive(self.core.release(claimed), conn)

    def accept_message(self, conn: Connection, *, subscriber: str, message_id: str, payload: Any = NO_PAYLOAD) -> bool:
        """True the first time (subscriber, message_id) is seen, in the caller's transaction; False on redelivery.
        A redelivery whose payload differs from the first one's raises RequestMismatch."""
        flow = self.core.accept_message(subscriber, message_id, payload)
        self.core.checked(conn)
        return self.drive(flow, conn)

    # --- the idempotent consumer -------------------------------------------------------------------------------

    def consume(self, *, subscriber: str, message_id: str, handler: SyncEffect, payload: Any = NO_PAYLOAD,
                on_mismatch: OnMismatch = Disposition.DEAD_LETTER, retry: RetryPolicy | None = None) -> Delivery:
        """Run `handler(conn)` and record (subscriber, message_id) in one transaction, once per message id.

        A redelivery (or a duplicate publish) of a message processed before returns a Delivery with
        `duplicate=True` and `Disposition.ACK` without calling the handler; one whose `payload` differs from the
        first one's gets the disposition `on_mismatch` chooses. Retried like `run`; the handler's error reaches the
        caller unchanged (nothing is recorded: the message is not processed)."""
        flow = self.core.consume(subscriber=subscriber, message_id=message_id, payload=payload,
                                 on_mismatch=on_mismatch, retry=retry)  # validates before the first connection
        refuse_async_effect(handler, "handler")
        return self.drive(flow, effect=handler)

    # --- the whole protocol in one call --------------------------------------------------------------------------

    def run(self, *, scope: str, operation: str, key: str, request: Any, effect: SyncEffect, status: int = 200,
            lease: timedelta | None = None, retry: RetryPolicy | None = None,
            on_in_flight: OnInFlight = "wait") -> Result:
        """Claim, run `effect(conn)` and store its response once; replay it to every retry.

        Raises RequestMismatch, RequestInFlight, InvalidKey, or RetriesExhausted when retryable errors
        (busy, serialization failure, deadlock, lock timeout, lost connection) outlast the retry budget.
        `effect` may return `Reply(response, status)` to store a status other than `status`.
        With `lease`, the claim is renewed while the effect runs (a third of the lease apart, on a connection of its
        own), so an effect that outlives its lease is not taken over; where the engine has one write lock (SQLite)
        the effect's transaction holds it, so no renewal is needed: a retry waits for the effect, then replays.
        `on_in_flight` says what an atomic run (no `lease`) does when another caller's claim of the same key is not
        committed yet (its effect still running): "wait" (the default) for that transaction to end, then replay its
        response (or claim, if it rolled back); "conflict": raise RequestInFlight at once (`retry_after` 1 s), using
        the engine's own lock-timeout / no-wait mechanism. On SQLite the write lock is the database's, so "conflict"
        also answers in flight while any other key is being written. A leased run always answers RequestInFlight.
        """
        flow = self.core.run(scope=scope, operation=operation, key=key, request=request, status=status,
                              lease=lease, retry=retry, on_in_flight=on_in_flight)  # validated before any SQL
        refuse_async_effect(effect)
        return self.drive(flow, effect=effect)

    # --- retention -----------------------------------------------------------------------------------------------

    def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
              progress: Callable[[str, int], None] | None = None) -> int:
        """Delete records completed (or abandoned, lease over) longer than `older_than` (default: the store's
        `retention`) ago, and processed messages as old, in batches of one transaction each. A live in-flight claim
        is never touched. `progress(table, deleted)` is called after each batch."""
        return self.drive(self.core.purge(older_than, batch_size, progress))

    def stats(self) -> Stats:
        """The tables now: records by state (completed, in flight, expired lease), the oldest claim not completed,
        the records and messages past `retention` waiting for `purge`, and each table's size where the engine
        reports it (one read; no lock a claim waits for)."""
        return self.drive(self.core.stats())

    # --- the loop ------------------------------------------------------------------------------------------------

    def drive(self, flow: Flow[T], conn: Connection | None = None, effect: SyncEffect | None = None) -> T:
        """Run `flow` to its end, each step executed here (how adapters such as the HTTP runner run their flows)."""
        stepper = Stepper(flow)
        while (step := stepper.next()) is not None:
            try:
                stepper.send(self._execute(step, conn, effect))
            except BaseException as exc:
                stepper.throw(exc)
        return stepper.value

    def _execute(self, step: Step, conn: Connection | None, effect: SyncEffect | None) -> Any:
        if isinstance(step, Sql):
            return execute_unlogged(conn, step.fn)  # type: ignore[arg-type]
        if isinstance(step, Effect):
            assert effect is not None, "a flow with an Effect step needs an effect"
            with beating(step.heartbeat, self.drive):  # renews a leased claim while the effect runs
                response = effect(conn)  # type: ignore[arg-type]
            refuse_awaitable(response)
            return response
        if isinstance(step, Transaction):
            with self._transaction(step.begin) as c:  # nothing to shield from: a sync call is not cancelled
                return self.drive(step.body, c, effect)
        time.sleep(step.seconds)
        return None

    @contextmanager
    def _transaction(self, begin: Begin) -> Iterator[Connection]:
        backend = self.backend
        with backend.connect(self.engine) as conn:
            self.core.ready(conn)
            with (backend.claim_transaction if begin is Begin.CLAIM else backend.transaction)(conn):
                yield conn
