"""What the sync and async stores share around the protocol: their public attributes, the flows they drive
(`claims`, the inbox, retention), and the guards that keep a sync effect out of the async store and an async one out
of the sync store."""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from inspect import CO_COROUTINE
from types import FunctionType
from typing import TypeVar

from sqlalchemy.engine import Connection, Dialect, Engine

from .claims import Claims
from .core import Core
from .dialects.base import Backend
from .errors import AsyncMisuse, IdemError, InvalidPayload, RetryCause
from .execution.plan import plan
from .features import Features
from .fingerprint import Encoder
from .ids import Identity, Origin, current, origin_of
from .inbox import Inbox
from .limits import check_retention
from .outbox import Outbox, Prepared
from .retention import Retention
from .retry import RetryPolicy
from .schema import Tables
from .steps import Exec

# Called with a store statement's SQL before (False) and after (True) it runs, in the thread or task that runs it.
StatementHook = Callable[[str, bool], None]

# --- what both stores expose -----------------------------------------------------------------------------------------


class StoreBase:
    """The attributes and engine-neutral methods of every store, and the flows it drives.

    `claims` is the protocol's claim flows (claim, complete, release, renew, heartbeat, run), the declared API that
    adapters (the HTTP layer) build their own flows on and run with the store's `drive`; `outbox` the outbox's
    flows (claim, settle, stats, requeue), which the relays drive."""

    _core: Core
    _hook: StatementHook | None = None

    def _adopt(self, core: Core) -> None:
        self._core = core
        self.claims = Claims(core)
        self._inbox = Inbox(core)
        self._retention = Retention(core)
        self.outbox = Outbox(core)
        self.table_prefix: str = core.table_prefix
        self.backend: Backend = core.backend
        self.tables: Tables = core.tables
        self.identity_limit: int = core.identity_limit
        self.retries: Counter[str] = core.retries  # retries absorbed, by cause, since this store was made

    @property
    def features(self) -> Features:
        """What the backend offers on this database (refined from the server in the store's first transaction)."""
        return self._core.features

    @property
    def retry(self) -> RetryPolicy:
        """The retry budget of `run` and `purge` (settable)."""
        return self._core.retry

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None:
        self._core.retry = policy

    @property
    def retention(self) -> timedelta:
        """How long completed records are kept for replays: what `purge` deletes when not given `older_than`, and
        the backlog `stats` counts (settable)."""
        return self._core.retention

    @retention.setter
    def retention(self, window: timedelta) -> None:
        self._core.retention = check_retention(window)

    @property
    def encoder(self) -> Encoder | None:
        """Turns values that are not plain JSON into JSON (settable; None refuses them)."""
        return self._core.encoder

    @encoder.setter
    def encoder(self, encoder: Encoder | None) -> None:
        self._core.encoder = encoder

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        """Why `run` would retry after `exc` (None: it propagates unchanged)."""
        return self._core.retry_cause(exc)

    def _command(self, destination: object, payload: object, headers: object, scope: object,
                 origin: Identity | Origin | None, sequence: int | None) -> Prepared:
        """A command for `add_command`, validated before any SQL: numbered in the running effect's sequence, or
        with an explicit `origin` (the step-by-step API's Claimed) and `sequence`."""
        if origin is None:
            writing = current()
            if writing is None:
                raise IdemError("add_command() outside an effect needs origin= (the Claimed of the step-by-step API)"
                                " and sequence=: inside run's effect, an HTTP handler in atomic mode or a consumer's"
                                " handler, the record is known")
            found = writing.origin
            number = writing.next() if sequence is None else sequence
        else:
            if sequence is None:
                raise InvalidPayload("sequence", "is needed with an explicit origin: number the commands of one"
                                                 " record 0, 1, ... the same way on every attempt")
            found, number = origin_of(origin), sequence
        return self.outbox.prepare(found, number, destination, payload, headers, scope)


def statement_sql(step: Exec, dialect: Dialect) -> str:
    """The SQL of a statement step as the store sends it on `dialect` (for a `statement_hook`)."""
    return plan(step.statement, dialect).sql


_Store = TypeVar("_Store", bound=StoreBase)


def owning_engine(make: Callable[[], _Store], dispose: Callable[[], object]) -> _Store:
    """The store `make` builds on an engine its `from_url` created (its executor then disposes of that engine on
    `close()`); if the store cannot be built, the engine is disposed of now, since no caller ever holds it."""
    try:
        return make()
    except BaseException:
        dispose()
        raise


def connect(engine: Engine, backend: Backend) -> Connection:
    """A connection from `engine` (closed by leaving its `with` block). Failing to open one raises what the backend's
    classifier makes of it: CannotConnect (no statement ran, so `run` retries it within its budget) or a
    ConnectionConfigError naming the fix; a pool whose every connection stayed in use for its pool_timeout raises
    PoolExhausted (retried too: contention). A plain function, not a context manager of its own: one per request."""
    try:
        return engine.connect()
    except Exception as exc:
        problem = backend.errors.checkout_error(exc)
        if problem is None:
            raise
        raise problem from exc


# --- keeping sync and async apart ----------------------------------------------------------------------------------

def is_async_callable(fn: object) -> bool:
    """An `async def` function, a partial of one, or an object whose `__call__` is one."""
    if type(fn) is FunctionType and "_is_coroutine_marker" not in fn.__dict__:
        # The usual effect, a plain function or lambda: its code's flag is inspect's answer, without inspect's dozen
        # calls per request (a function marked by `inspect.markcoroutinefunction` goes the long way).
        return bool(fn.__code__.co_flags & CO_COROUTINE)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def refuse_async_effect(effect: object, name: str = "effect") -> None:
    if is_async_callable(effect):
        raise AsyncMisuse(f"{name} is an `async def` function: the sync IdempotencyStore calls its {name}"
                          " synchronously; use AsyncIdempotencyStore (idem_dialects.AsyncIdempotencyStore) for"
                          f" an async {name}, or pass a plain function")
    if not callable(effect):
        raise _not_callable(effect, name, "must be callable")


def refuse_sync_effect(effect: object, name: str = "effect") -> None:
    if not callable(effect):
        raise _not_callable(effect, name, "must be an `async def` function")
    if not is_async_callable(effect):
        raise AsyncMisuse(f"{name} must be an `async def` function taking the AsyncConnection (AsyncIdempotencyStore"
                          f" awaits it); for a sync function write `async def {name}(conn): return await"
                          f" conn.run_sync(sync_{name})`, or use the sync IdempotencyStore")


def _not_callable(effect: object, name: str, rule: str) -> InvalidPayload:
    return InvalidPayload(name, f"{rule}, got {type(effect).__name__}")


_NEVER_AWAITABLE = frozenset({dict, list, tuple, str, bytes, int, float, bool, type(None)})


def refuse_awaitable(response: object) -> None:
    """A sync effect that returned an awaitable (e.g. a lambda calling an async function) never ran its body."""
    if type(response) in _NEVER_AWAITABLE:  # the usual response: no ABC check per request
        return
    if inspect.isawaitable(response):
        close = getattr(response, "close", None)
        if callable(close):
            close()  # no "coroutine was never awaited" warning: the error below says what happened
        raise AsyncMisuse("the effect returned an awaitable: the sync IdempotencyStore does not await it; use"
                          " AsyncIdempotencyStore for async effects")
