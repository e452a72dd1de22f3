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
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.util import await_only

from idem_dialects import AsyncIdempotencyStore, IdempotencyStore, Result
from idem_dialects.relay import AsyncRelay

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
    """IdempotencyStore's sync API, every call served by an AsyncIdempotencyStore."""

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
        self.table_prefix = self.aio.table_prefix
        self.tables = self.aio.tables
        self.backend = self.aio.backend

    @property
    def features(self) -> Any:
        return self.aio.features

    @property
    def retries(self) -> Any:
        return self.aio.retries

    def retry_cause(self, exc: BaseException) -> Any:
        return self.aio.retry_cause(exc)

    def create_tables(self) -> None:
        self._loop.call(self.aio.create_tables())

    def drop_tables(self) -> None:
        self._loop.call(self.aio.drop_tables())

    def close(self) -> None:
        try:
            self._loop.call(self.aio.close())
        finally:
            self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[BridgedConnection]:
        cm = self.aio.transaction()
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
    def claim(self, conn: BridgedConnection | Connection, **kwargs: Any) -> Any:
        if isinstance(conn, Connection):
            return self.sync.claim(conn, **kwargs)
        return self._loop.call(self.aio.claim(conn.aconn, **kwargs))

    def complete(self, conn: BridgedConnection | Connection, claimed: Any, response: Any, status: int = 200) -> None:
        if isinstance(conn, Connection):
            return self.sync.complete(conn, claimed, response, status)
        self._loop.call(self.aio.complete(conn.aconn, claimed, response, status))

    def release(self, conn: BridgedConnection | Connection, claimed: Any) -> bool:
        if isinstance(conn, Connection):
            return self.sync.release(conn, claimed)
        return self._loop.call(self.aio.release(conn.aconn, claimed))

    def accept_message(self, conn: BridgedConnection | Connection, **kwargs: Any) -> bool:
        if isinstance(conn, Connection):
            return self.sync.accept_message(conn, **kwargs)
        return self._loop.call(self.aio.accept_message(conn.aconn, **kwargs))

    def drive(self, flow: Any, conn: BridgedConnection | Connection | None = None) -> Any:
        """A flow (a backend's statements, say) run by the async store's loop on a bridged transaction."""
        if isinstance(conn, Connection):
            return self.sync.drive(flow, conn)
        return self._loop.call(self.aio.drive(flow, None if conn is None else conn.aconn))

    def run(self, *, effect: Callable[[Connection], Any], **kwargs: Any) -> Result:
        if not callable(effect):  # let the async store refuse it, before any SQL, as it would refuse a user's
            return self._loop.call(self.aio.run(effect=effect, **kwargs))

        async def bridged(aconn: AsyncConnection) -> Any:
            return await aconn.run_sync(effect)

        return self._loop.call(self.aio.run(effect=bridged, **kwargs))

    def purge(self, *args: Any, **kwargs: Any) -> int:
        return self._loop.call(self.aio.purge(*args, **kwargs))

    @property
    def outbox(self) -> Any:
        return self.aio.outbox

    def add_command(self, conn: BridgedConnection | Connection, *args: Any, **kwargs: Any) -> str:
        if isinstance(conn, BridgedConnection):
            return self._loop.call(self.aio.add_command(conn.aconn, *args, **kwargs))
        # The sync Connection a bridged effect gets (run_sync's greenlet, on the loop's thread): the async store's
        # own flow on the AsyncConnection around it, awaited from that greenlet as SQLAlchemy awaits its drivers.
        return await_only(self.aio.add_command(AsyncConnection(self.aio.engine, conn), *args, **kwargs))

    def consume(self, *, handler: Callable[[Connection], Any], **kwargs: Any) -> Any:
        async def bridged(aconn: AsyncConnection) -> Any:
            return await aconn.run_sync(handler)

        return self._loop.call(self.aio.consume(handler=bridged, **kwargs))

    def relay(self, routes: Any, **options: Any) -> BridgedRelay:
        """An AsyncRelay on the async store, its rounds run on the bridge's loop."""
        return BridgedRelay(AsyncRelay(self.aio, routes, **options), self._loop)


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
