"""Running a handler under the policy on the async store (ASGI, FastAPI): the twin of `driver`, awaited.

Atomic mode: `store.run` claims, awaits the handler with the record's AsyncConnection (also `current_connection()`
and `request.state.idem_connection`) and stores the response in the same transaction. External-call mode
(`policy.lease`): the claim commits alone, the handler runs outside any transaction, then the response is stored in
a short transaction of its own, or the claim is released if the handler failed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from ..aio import AsyncIdempotencyStore
from ..errors import IdemError
from ..outcomes import Claimed
from ..retry import acall_with_retry
from ..store import Reply
from .core import HttpRequest, IdempotencyPolicy, NotStored, ResponseTooLarge, prepare
from .exchange import Exchange
from .problems import HttpResponse

AsyncHandler = Callable[[Any], Awaitable[HttpResponse]]


class AsyncIdempotency:
    """One async store and one policy; `await handle(request, handler)` is what every async adapter calls."""

    def __init__(self, store: AsyncIdempotencyStore, policy: IdempotencyPolicy) -> None:
        self.store = store
        self.policy = policy

    async def handle(self, req: HttpRequest, handler: AsyncHandler) -> HttpResponse:
        prepared = prepare(self.policy, req)
        if prepared is None:
            return await handler(None)
        if isinstance(prepared, HttpResponse):
            return prepared
        ex = Exchange(self.policy, prepared)
        try:
            if self.policy.lease is None:
                return await self._atomic(ex, handler)
            return await self._external(ex, handler)
        except (ResponseTooLarge, IdemError) as exc:
            return ex.answer(exc)

    async def _atomic(self, ex: Exchange, handler: AsyncHandler) -> HttpResponse:
        async def effect(conn: AsyncConnection) -> Reply:
            with ex.handling(conn):
                resp = await handler(conn)
            return ex.stored(resp)

        try:
            result = await self.store.run(**ex.identity, effect=effect)
        except NotStored as ns:
            return ns.response
        return ex.ran(result)

    async def _external(self, ex: Exchange, handler: AsyncHandler) -> HttpResponse:
        store = self.store
        outcome = await self._retrying(lambda conn: store.claim(conn, **ex.identity, lease=self.policy.lease))
        if not isinstance(outcome, Claimed):
            return ex.unclaimed(outcome)
        try:
            with ex.handling():
                resp = await handler(None)
        except BaseException:
            await self._release(outcome)
            raise  # the handler's own error, unchanged
        body = ex.to_store(resp)
        if body is None:
            await self._release(outcome)
        else:
            await self._retrying(lambda conn: store.complete(conn, outcome, body, resp.status))
        return resp

    async def _release(self, claimed: Claimed) -> None:
        try:
            await self._retrying(lambda conn: self.store.release(conn, claimed))
        except Exception:  # the lease ends on its own; the handler's outcome matters more
            pass

    async def _retrying(self, step: Callable[[AsyncConnection], Awaitable[Any]]) -> Any:
        """One short transaction, re-run on the store's retryable errors within its retry budget."""
        async def once() -> Any:
            async with self.store.transaction() as conn:
                return await step(conn)
        return await acall_with_retry(self.store.retry, self.store.retry_cause, once)
