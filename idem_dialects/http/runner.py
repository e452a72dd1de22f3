"""Running a handler under the policy: the request flow (`exchange.py`) on the sync or the async store.

The two runners differ only in calling or awaiting the handler; they are what every adapter calls (WSGI and Flask
the sync one, ASGI and FastAPI the async one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from ..store import IdempotencyStore
from .core import HandlerErrors, HttpRequest, IdempotencyPolicy, store_identity
from .exchange import exchange
from .problems import HttpResponse

if TYPE_CHECKING:
    from ..aio import AsyncIdempotencyStore

Handler = Callable[[Connection | None], HttpResponse]
AsyncHandler = Callable[[Any], Awaitable[HttpResponse]]


class Idempotency:
    """One sync store and one policy: `handle(request, handler)` answers a request, running the handler at most
    once per key (in atomic mode with the record's connection, also `current_connection()`)."""

    def __init__(self, store: IdempotencyStore, policy: IdempotencyPolicy) -> None:
        self.store = store
        self.policy = policy
        self.identity = store_identity(store.core.engine.url, store.core.table_prefix)  # see core.claimed_outside

    def handle(self, req: HttpRequest, handler: Handler) -> HttpResponse:
        errors = HandlerErrors()

        def effect(conn: Connection | None) -> HttpResponse:
            with errors.noting(conn):
                return handler(conn)

        return self.store.drive(exchange(self.store.core, self.policy, req, errors), effect=effect)


class AsyncIdempotency:
    """One async store and one policy: `await handle(request, handler)` answers a request, awaiting the handler at
    most once per key (in atomic mode with the record's AsyncConnection, also `current_connection()`)."""

    def __init__(self, store: AsyncIdempotencyStore, policy: IdempotencyPolicy) -> None:
        self.store = store
        self.policy = policy
        self.identity = store_identity(store.core.engine.url, store.core.table_prefix)  # see core.claimed_outside

    async def handle(self, req: HttpRequest, handler: AsyncHandler) -> HttpResponse:
        errors = HandlerErrors()

        async def effect(conn: Any) -> HttpResponse:
            with errors.noting(conn):
                return await handler(conn)

        return await self.store.drive(exchange(self.store.core, self.policy, req, errors), effect=effect)
