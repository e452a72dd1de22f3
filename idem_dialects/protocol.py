"""The engine- and I/O-neutral pieces both stores share: request validation, what an effect may return, how an
outcome becomes a Result or an error, and the guards that keep sync and async from being mixed."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from .dialects.base import Backend
from .errors import AsyncMisuse, InvalidPayload, RequestInFlight, RequestMismatch, UnsupportedIsolation
from .fingerprint import Encoder, fingerprint
from .keys import MAX_IDENTITY_BYTES, check_identifier, check_identity_size
from .limits import check_status, lease_seconds
from .outcomes import InFlight, Mismatch, Outcome, Replayed, Result


@dataclass(frozen=True, slots=True)
class Reply:
    """What an effect may return to store a status other than `run`'s default with its response."""

    response: Any
    status: int = 200


def check_isolation(backend: Backend, level: str | None) -> None:
    """Refuse, before any SQL, an isolation level the backend does not guarantee the protocol under."""
    if level is not None and level not in backend.features.isolation_levels:
        raise UnsupportedIsolation(backend.name, level, backend.features.isolation_levels)


@dataclass(frozen=True, slots=True)
class Request:
    """A request validated and fingerprinted once, before any SQL, however many attempts it takes."""

    scope: str
    operation: str
    key: str
    fingerprint: str
    lease: float | None
    # One claim token for every attempt of one run: a leased retry that finds this token on an in-flight record
    # knows the claim is its own (its COMMIT went through, the reply was lost) and carries on as the owner.
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def check(cls, scope: object, operation: object, key: object, request: object, lease: timedelta | None,
              encoder: Encoder | None = None, identity_limit: int = MAX_IDENTITY_BYTES) -> Request:
        fields = {"scope": check_identifier("scope", scope), "operation": check_identifier("operation", operation),
                  "key": check_identifier("key", key)}
        check_identity_size(fields, identity_limit)  # one limit on every engine (README: Inputs, limits and errors)
        return cls(fields["scope"], fields["operation"], fields["key"], fingerprint(request, encoder=encoder),
                   lease_seconds(lease))

    @property
    def ident(self) -> dict[str, str]:
        return {"scope": self.scope, "operation": self.operation, "idem_key": self.key}


def reply(response: Any, status: int) -> tuple[Any, int]:
    """(response, status) to store for what an effect returned: a `Reply` carries its own status."""
    if isinstance(response, Reply):
        return response.response, check_status(response.status)
    return response, status


class _OwnsEngine(Protocol):
    _owns_engine: bool


_Store = TypeVar("_Store", bound=_OwnsEngine)


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


def finished(outcome: Outcome, req: Request) -> Result:
    """What `run` answers for an outcome other than Claimed: the replayed Result, or the error it maps to."""
    if isinstance(outcome, Replayed):
        return Result(outcome.response, outcome.status, replayed=not outcome.own)
    ident = (req.scope, req.operation, req.key)
    if isinstance(outcome, Mismatch):
        raise RequestMismatch(*ident, outcome.stored_fingerprint, outcome.given_fingerprint)
    assert isinstance(outcome, InFlight)
    raise RequestInFlight(*ident, outcome.retry_after)


# --- keeping sync and async apart ----------------------------------------------------------------------------------

def is_async_callable(fn: object) -> bool:
    """An `async def` function, a partial of one, or an object whose `__call__` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def refuse_async_effect(effect: object) -> None:
    if is_async_callable(effect):
        raise AsyncMisuse("effect is an `async def` function: the sync IdempotencyStore calls its effect"
                          " synchronously; use AsyncIdempotencyStore (idem_dialects.AsyncIdempotencyStore) for"
                          " async effects, or pass a plain function")
    if not callable(effect):
        raise InvalidPayload("effect", f"must be callable, got {type(effect).__name__}")


def refuse_sync_effect(effect: object) -> None:
    if not callable(effect):
        raise InvalidPayload("effect", f"must be an `async def` function, got {type(effect).__name__}")
    if not is_async_callable(effect):
        raise AsyncMisuse("effect must be an `async def` function taking the AsyncConnection (AsyncIdempotencyStore"
                          " awaits it); for a sync function write `async def effect(conn): return await"
                          " conn.run_sync(sync_effect)`, or use the sync IdempotencyStore")


def refuse_awaitable(response: object) -> None:
    """A sync effect that returned an awaitable (e.g. a lambda calling an async function) never ran its body."""
    if inspect.isawaitable(response):
        close = getattr(response, "close", None)
        if callable(close):
            close()  # no "coroutine was never awaited" warning: the error below says what happened
        raise AsyncMisuse("the effect returned an awaitable: the sync IdempotencyStore does not await it; use"
                          " AsyncIdempotencyStore for async effects")


def is_async_dialect(target: Engine | URL) -> bool:
    """True for an engine or URL whose driver is asyncio-only (asyncpg, aiosqlite, asyncmy, ...)."""
    if isinstance(target, URL):
        try:
            return bool(getattr(target.get_dialect(), "is_async", False))
        except (NoSuchModuleError, ArgumentError):
            return False  # an unknown dialect or driver: reported where the engine is built, as before
    return bool(getattr(target.dialect, "is_async", False))
