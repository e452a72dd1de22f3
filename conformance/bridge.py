"""The sync API over AsyncIdempotencyStore, so every sync check also proves the async store (``--idem-api async``).
It stays because the checks are written once, in sync code, and this is what lets that one text run on both stores.

`BridgedStore` uses an event loop running in a thread of its own (one for the process); each call submits the
async store's coroutine to it and waits. A check's sync effect runs on the async driver through
`AsyncConnection.run_sync`, and a check's threads race as tasks on that one loop. `engine` is a sync engine on the
same database for the checks' own reads; the async engine's statements are also announced to its
``before_cursor_execute`` listeners, so "no SQL before validation" checks see the async store's SQL.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.util import await_only

from idem_dialects import AsyncIdempotencyStore, IdempotencyStore, Result
from idem_dialects.api import ClaimFlows, OutboxFlows, StoreAPI
from idem_dialects.core import NO_PAYLOAD
from idem_dialects.errors import RetryCause
from idem_dialects.features import Features
from idem_dialects.fingerprint import Encoder
from idem_dialects.ids import Identity, Origin
from idem_dialects.limits import DEFAULT_PACE, OnInFlight
from idem_dialects.outcomes import Claimed, Delivery, Disposition, OnMismatch, Outcome
from idem_dialects.relay import AsyncRelay
from idem_dialects.retention import Stats
from idem_dialects.retry import RetryPolicy
from idem_dialects.steps import Flow

T = TypeVar("T")


class _Loop:
    """An event loop running in a daemon thread of its own for the rest of the process, shared by every bridged
    store. It is never stopped: SQLAlchemy's greenlets belong to this thread, and an exception a check keeps
    (pytest.raises) still references them from its traceback; freed later from another thread, a greenlet of a live
    thread is handed back to it, while one of a thread that has ended is a known way to crash the interpreter."""

    _shared: _Loop | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="idem-bridge-loop", daemon=True)
        self.thread.start()

    @classmethod
    def shared(cls) -> _Loop:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


class BridgedConnection:
    """A check's view of the AsyncConnection of a bridged transaction: every method runs on the sync connection
    inside the loop's greenlet (results are buffered by SQLAlchemy's async adapters, so they read back here)."""

    def __init__(self, aconn: AsyncConnection, loop: _Loop) -> None:
        self.aconn = aconn
        self._loop = loop

    def within(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call fn(sync_connection, *args, **kwargs) on the loop, in the connection's greenlet."""

        async def go() -> T:
            return await self.aconn.run_sync(lambda conn: fn(conn, *args, **kwargs))

        return self._loop.call(go())

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.aconn.sync_connection, name)
        if not callable(attr):
            return attr
        return lambda *args, **kwargs: self.within(lambda conn: getattr(conn, name)(*args, **kwargs))


class BridgedStore:
    """The sync store surface (`StoreAPI`), every call served by an AsyncIdempotencyStore."""

    def __init__(self, url: URL, sync_url: URL, *, table_prefix: str, **engine_options: Any) -> None:
        self._loop = _Loop.shared()
        self.aio = self._loop.call(_make(url, table_prefix, engine_options))
        # The checks' own reads and DDL of their business table, at the isolation level the store was given.
        self.engine = create_engine(sync_url, **{k: v for k, v in engine_options.items() if k == "isolation_level"})
        type(self.aio.backend)(self.engine)  # consumes the URL's options on this engine too (e.g. a pooler's)
        event.listen(self.aio.engine.sync_engine, "before_cursor_execute",
                     lambda *args: self.engine.dispatch.before_cursor_execute(*args))
        # The same flows on the checks' sync connections (a check driving a Connection of `engine` itself).
        self.sync = IdempotencyStore(self.engine, table_prefix=table_prefix)
        self.tables = self.aio.tables
        self.backend = self.aio.backend

    # --- what the async store says of itself -------------------------------------------------------------------

    @property
    def table_prefix(self) -> str:
        return self.aio.table_prefix

    @property
    def features(self) -> Features:
        return self.aio.features

    @property
    def claims(self) -> ClaimFlows:
        return self.aio.claims

    @property
    def outbox(self) -> OutboxFlows:
        return self.aio.outbox

    @property
    def retries(self) -> Counter[str]:
        return self.aio.retries

    @property
    def retry(self) -> RetryPolicy:
        return self.aio.retry

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None:
        self.aio.retry = policy

    @property
    def retention(self) -> timedelta:
        return self.aio.retention

    @retention.setter
    def retention(self, window: timedelta) -> None:
        self.aio.retention = window

    @property
    def encoder(self) -> Encoder | None:
        return self.aio.encoder

    @encoder.setter
    def encoder(self, encoder: Encoder | None) -> None:
        self.aio.encoder = encoder

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        return self.aio.retry_cause(exc)

    # --- the surface, each call on the bridge's loop ---------------------------------------------------------------

    def create_tables(self, *, generations: bool = False) -> None:
        self._loop.call(self.aio.create_tables(generations=generations))

    def drop_tables(self) -> None:
        self._loop.call(self.aio.drop_tables())

    def close(self) -> None:
        try:
            self._loop.call(self.aio.close())
        finally:
            self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @contextmanager
    def transaction(self, *, scope: str | None = None) -> Iterator[Any]:
        cm = self.aio.transaction(scope=scope)
        aconn = self._loop.call(cm.__aenter__())
        try:
            yield BridgedConnection(aconn, self._loop)
        except BaseException as exc:
            if not self._loop.call(cm.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self._loop.call(cm.__aexit__(None, None, None))

    # A check that drives a connection of its own `engine` (a sync Connection) gets the same protocol code run on
    # that sync connection; test_async.py proves those cases on the async drivers natively.
    def claim(self, conn: Any, *, scope: str, operation: str, key: str, request: Any,
              lease: timedelta | None = None) -> Outcome:
        if isinstance(conn, Connection):
            return self.sync.claim(conn, scope=scope, operation=operation, key=key, request=request, lease=lease)
        return self._loop.call(self.aio.claim(conn.aconn, scope=scope, operation=operation, key=key, request=request,
                                              lease=lease))

    def complete(self, conn: Any, claimed: Claimed, response: Any, status: int = 200) -> None:
        if isinstance(conn, Connection):
            return self.sync.complete(conn, claimed, response, status)
        self._loop.call(self.aio.complete(conn.aconn, claimed, response, status))

    def release(self, conn: Any, claimed: Claimed) -> bool:
        if isinstance(conn, Connection):
            return self.sync.release(conn, claimed)
        return self._loop.call(self.aio.release(conn.aconn, claimed))

    def accept_message(self, conn: Any, *, subscriber: str, message_id: str, payload: Any = NO_PAYLOAD) -> bool:
        if isinstance(conn, Connection):
            return self.sync.accept_message(conn, subscriber=subscriber, message_id=message_id, payload=payload)
        return self._loop.call(self.aio.accept_message(conn.aconn, subscriber=subscriber, message_id=message_id,
                                                       payload=payload))

    def add_command(self, conn: Any, destination: str, payload: Any, headers: Mapping[str, str] | None = None, *,
                    scope: str | None = None, origin: Identity | Origin | None = None,
                    sequence: int | None = None) -> str:
        call = self.aio.add_command(conn.aconn if isinstance(conn, BridgedConnection) else
                                    # The sync Connection a bridged effect gets (run_sync's greenlet, on the loop's
                                    # thread): the async store's own flow on the AsyncConnection around it, awaited
                                    # from that greenlet as SQLAlchemy awaits its drivers.
                                    AsyncConnection(self.aio.engine, conn), destination, payload, headers,
                                    scope=scope, origin=origin, sequence=sequence)
        if isinstance(conn, BridgedConnection):
            return self._loop.call(call)
        return await_only(call)

    def consume(self, *, subscriber: str, message_id: str, handler: Callable[[Any], Any], payload: Any = NO_PAYLOAD,
                on_mismatch: OnMismatch = Disposition.DEAD_LETTER, retry: RetryPolicy | None = None,
                scope: str | None = None) -> Delivery:
        async def bridged(aconn: AsyncConnection) -> Any:
            return await aconn.run_sync(handler)

        return self._loop.call(self.aio.consume(subscriber=subscriber, message_id=message_id, handler=bridged,
                                                payload=payload, on_mismatch=on_mismatch, retry=retry, scope=scope))

    def run(self, *, scope: str, operation: str, key: str, request: Any, effect: Callable[[Any], Any],
            status: int = 200, lease: timedelta | None = None, retry: RetryPolicy | None = None,
            on_in_flight: OnInFlight = "wait") -> Result:
        async def bridged(aconn: AsyncConnection) -> Any:
            return await aconn.run_sync(effect)

        # Not callable: the async store refuses it, before any SQL, as it would refuse a user's.
        return self._loop.call(self.aio.run(scope=scope, operation=operation, key=key, request=request,
                                            effect=bridged if callable(effect) else effect, status=status,
                                            lease=lease, retry=retry, on_in_flight=on_in_flight))

    def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
              progress: Callable[[str, int], None] | None = None, pace: float = DEFAULT_PACE) -> int:
        return self._loop.call(self.aio.purge(older_than, batch_size, progress, pace))

    def stats(self) -> Stats:
        return self._loop.call(self.aio.stats())

    def drive(self, flow: Flow[T], conn: Any = None, effect: Callable[[Any], Any] | None = None) -> T:
        """A flow (a backend's statements, say) run by the async store's loop on a bridged transaction."""
        if isinstance(conn, Connection):
            return self.sync.drive(flow, conn, effect)
        bridged = None if effect is None else _awaiting(effect)
        return self._loop.call(self.aio.drive(flow, None if conn is None else conn.aconn, bridged))

    def relay(self, routes: Any, **options: Any) -> BridgedRelay:
        """An AsyncRelay on the async store, its rounds run on the bridge's loop."""
        return BridgedRelay(AsyncRelay(self.aio, routes, **options), self._loop)


def _awaiting(effect: Callable[[Any], Any]) -> Callable[[AsyncConnection], Awaitable[Any]]:
    async def bridged(aconn: AsyncConnection) -> Any:
        return await aconn.run_sync(effect)

    return bridged


class BridgedRelay:
    """`Relay`'s sync API over an AsyncRelay."""

    def __init__(self, relay: AsyncRelay, loop: _Loop) -> None:
        self.relay, self._loop = relay, loop
        self.metrics = relay.metrics

    def run_once(self) -> int:
        return self._loop.call(self.relay.run_once())

    def close(self) -> None:
        pass


async def _make(url: URL, table_prefix: str, engine_options: dict[str, Any]) -> AsyncIdempotencyStore:
    return AsyncIdempotencyStore.from_url(url, table_prefix=table_prefix, **engine_options)


if TYPE_CHECKING:  # mypy holds the bridge against the declared surface (idem_dialects.api)
    def _surface(it: BridgedStore) -> StoreAPI[Any]:
        return it
