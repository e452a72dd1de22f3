"""Running a handler under the policy: the request flow (`exchange.py`) on the sync or the async store.

The two runners differ only in calling or awaiting the handler; they are what every adapter calls (WSGI and Flask
the sync one, ASGI and FastAPI the async one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from .core import HandlerErrors, store_identity
from .exchange import exchange
from .policy import HttpRequest, IdempotencyPolicy
from .problems import HttpResponse

if TYPE_CHECKING:
    from ..api import AsyncStoreAPI, StoreAPI

Handler = Callable[[Connection | None], HttpResponse]
AsyncHandler = Callable[[Any], Awaitable[HttpResponse]]


def identity(store: Any) -> str:
    """What tells two stores apart to a request (`core.store_identity`); a sharded store is its shards together."""
    shards = getattr(store, "shards", None)
    if isinstance(shards, dict):
        return "shards:" + ";".join(identity(s) for s in shards.values())
    return store_identity(store.engine.url, store.table_prefix)


class Idempotency:
    """One sync store and one policy: `handle(request, handler)` answers a request, running the handler at most
    once per key (in atomic mode with the record's connection, also `current_connection()`)."""

    def __init__(self, store: StoreAPI[Any], policy: IdempotencyPolicy) -> None:
        self.store = store
        self.policy = policy
        self.identity = identity(store)  # see core.claimed_outside

    def handle(self, req: HttpRequest, handler: Handler) -> HttpResponse:
        errors = HandlerErrors()
        return self.store.drive(exchange(self.store.claims, self.identity, self.policy, req, errors),
                                effect=partial(_called, errors, handler))


class AsyncIdempotency:
    """One async store and one policy: `await handle(request, handler)` answers a request, awaiting the handler at
    most once per key (in atomic mode with the record's AsyncConnection, also `current_connection()`)."""

    def __init__(self, store: AsyncStoreAPI[Any], policy: IdempotencyPolicy) -> None:
        self.store = store
        self.policy = policy
        self.identity = identity(store)  # see core.claimed_outside

    async def handle(self, req: HttpRequest, handler: AsyncHandler) -> HttpResponse:
        errors = HandlerErrors()
        return await self.store.drive(exchange(self.store.claims, self.identity, self.policy, req, errors),
                                      effect=partial(_awaited, errors, handler))


# The effects: the handler under `errors.noting` (partials of these rather than a closure per request).
def _called(errors: HandlerErrors, handler: Handler, conn: Connection | None) -> HttpResponse:
    with errors.noting(conn):
        return handler(conn)


async def _awaited(errors: HandlerErrors, handler: AsyncHandler, conn: Any) -> HttpResponse:
    with errors.noting(conn):
        return await handler(conn)
