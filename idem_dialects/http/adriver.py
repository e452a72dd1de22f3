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
from ..outcomes import Claimed, Outcome
from ..retry import acall_with_retry
from ..store import Reply
from .core import (
    Call,
    HandlerErrors,
    HttpRequest,
    IdempotencyPolicy,
    NotStored,
    ResponseTooLarge,
    _connection,
    encode_stored,
    outcome_response,
    prepare,
    replay_response,
    stored_reply,
)
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
        errors = HandlerErrors()

        async def tracked(conn: Any) -> HttpResponse:
            try:
                return await handler(conn)
            except BaseException as exc:
                errors.note(exc)
                raise

        try:
            if self.policy.lease is None:
                return await self._atomic(prepared, tracked)
            return await self._external(prepared, tracked)
        except (ResponseTooLarge, IdemError) as exc:
            return errors.answer(self.policy, exc)

    async def _atomic(self, call: Call, handler: AsyncHandler) -> HttpResponse:
        first: list[HttpResponse] = []

        async def effect(conn: Any) -> Reply:
            token = _connection.set(conn)
            try:
                resp = await handler(conn)
            finally:
                _connection.reset(token)
            return stored_reply(self.policy, resp, first)

        try:
            result = await self.store.run(scope=call.scope, operation=call.operation, key=call.key,
                                          request=call.request, effect=effect)
        except NotStored as ns:
            return ns.response
        if result.replayed:
            return replay_response(self.policy, call, result.response, result.status)
        return first[0]

    async def _external(self, call: Call, handler: AsyncHandler) -> HttpResponse:
        store, policy = self.store, self.policy

        async def claim(conn: Any) -> Outcome:
            return await store.claim(conn, scope=call.scope, operation=call.operation, key=call.key,
                                     request=call.request, lease=policy.lease)

        outcome = await self._retrying(claim)
        answer = outcome_response(policy, call, outcome)
        if answer is not None:
            return answer
        assert isinstance(outcome, Claimed)
        try:
            resp = await handler(None)
        except BaseException:
            await self._release(outcome)
            raise  # the handler's own error, unchanged
        if not policy.store_status(resp.status):
            await self._release(outcome)
            return resp
        body = encode_stored(policy, resp)

        async def complete(conn: Any) -> None:
            await store.complete(conn, outcome, body, resp.status)

        await self._retrying(complete)
        return resp

    async def _release(self, claimed: Claimed) -> None:
        async def release(conn: Any) -> bool:
            return await self.store.release(conn, claimed)

        try:
            await self._retrying(release)
        except Exception:  # the lease ends on its own; the handler's outcome matters more
            pass

    async def _retrying(self, step: Callable[[AsyncConnection], Awaitable[Any]]) -> Any:
        """One short transaction, re-run on the store's retryable errors within its retry budget."""
        async def once() -> Any:
            async with self.store.transaction() as conn:
                return await step(conn)
        return await acall_with_retry(self.store.retry, self.store.retry_cause, once)
