"""What the sync and async stores share around the protocol: their public attributes, and the guards that keep a
sync effect out of the async store and an async one out of the sync store."""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from .dialects.base import Backend
from .errors import AsyncMisuse, InvalidPayload, RetryCause
from .features import Features
from .fingerprint import Encoder
from .limits import check_retention
from .protocol import Core
from .retry import RetryPolicy
from .schema import Tables

# --- what both stores expose -----------------------------------------------------------------------------------------

class StoreBase:
    """The attributes and engine-neutral methods of both stores: their `Core`'s, under the public names."""

    core: Core
    _owns_engine: bool

    def _adopt(self, core: Core) -> None:
        self.core = core
        self.table_prefix: str = core.table_prefix
        self.backend: Backend = core.backend
        self.tables: Tables = core.tables
        self.identity_limit: int = core.identity_limit
        self.retries: Counter[str] = core.retries  # retries absorbed, by cause, since this store was made
        self._owns_engine = False

    @property
    def features(self) -> Features:
        """What the backend offers on this database (refined from the server once a connection was made)."""
        return self.core.features

    @property
    def retry(self) -> RetryPolicy:
        """The retry budget of `run` and `purge` (settable)."""
        return self.core.retry

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None:
        self.core.retry = policy

    @property
    def retention(self) -> timedelta:
        """How long completed records are kept for replays: what `purge` deletes when not given `older_than`, and
        the backlog `stats` counts (settable)."""
        return self.core.retention

    @retention.setter
    def retention(self, window: timedelta) -> None:
        self.core.retention = check_retention(window)

    @property
    def encoder(self) -> Encoder | None:
        """Turns values that are not plain JSON into JSON (settable; None refuses them)."""
        return self.core.encoder

    @encoder.setter
    def encoder(self, encoder: Encoder | None) -> None:
        self.core.encoder = encoder

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        """Why `run` would retry after `exc` (None: it propagates unchanged)."""
        return self.core.retry_cause(exc)


_Store = TypeVar("_Store", bound=StoreBase)


def owning_engine(make: Callable[[], _Store], dispose: Callable[[], object]) -> _Store:
    """The store `make` builds on an engine its `from_url` created: `close()` disposes of that engine later; if the
    store cannot be built, the engine is disposed of now, since no caller ever holds it."""
    try:
        store = make()
    except BaseException:
        dispose()
        raise
    store._owns_engine = True
    return store


# --- keeping sync and async apart ----------------------------------------------------------------------------------

def is_async_callable(fn: object) -> bool:
    """An `async def` function, a partial of one, or an object whose `__call__` is one."""
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


def refuse_awaitable(response: object) -> None:
    """A sync effect that returned an awaitable (e.g. a lambda calling an async function) never ran its body."""
    if inspect.isawaitable(response):
        close = getattr(response, "close", None)
        if callable(close):
            close()  # no "coroutine was never awaited" warning: the error below says what happened
        raise AsyncMisuse("the effect returned an awaitable: the sync IdempotencyStore does not await it; use"
                          " AsyncIdempotencyStore for async effects")
