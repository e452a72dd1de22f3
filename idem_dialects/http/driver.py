"""Running a handler under the policy on the sync store (WSGI, Flask). The async twin is `adriver`.

Atomic mode: `store.run` claims, calls the handler with the record's connection (also `current_connection()`) and
stores the response in the same transaction, so the handler's writes and the record commit together or not at all;
`run` re-runs the whole transaction (handler included) on the engine's retryable errors, as it does for any effect.
External-call mode (`policy.lease`): the claim commits alone, the handler runs outside any transaction, then the
response is stored in a short transaction of its own, or the claim is released if the handler failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

from ..errors import IdemError
from ..outcomes import Claimed
from ..retry import call_with_retry
from ..store import IdempotencyStore, Reply
from .core import HttpRequest, IdempotencyPolicy, NotStored, ResponseTooLarge, prepare
from .exchange import Exchange
from .problems import HttpResponse

Handler = Callable[[Connection | None], HttpResponse]


class Idempotency:
    """One store and one policy; `handle(request, handler)` is what every sync adapter calls."""

    def __init__(self, store: IdempotencyStore, policy: IdempotencyPolicy) -> None:
        self.store = store
        self.policy = policy

    def handle(self, req: HttpRequest, handler: Handler) -> HttpResponse:
        prepared = prepare(self.policy, req)
        if prepared is None:
            return handler(None)
        if isinstance(prepared, HttpResponse):
            return prepared
        ex = Exchange(self.policy, prepared)
        try:
            if self.policy.lease is None:
                return self._atomic(ex, handler)
            return self._external(ex, handler)
        except (ResponseTooLarge, IdemError) as exc:
            return ex.answer(exc)

    def _atomic(self, ex: Exchange, handler: Handler) -> HttpResponse:
        def effect(conn: Connection) -> Reply:
            with ex.handling(conn):
                resp = handler(conn)
            return ex.stored(resp)

        try:
            result = self.store.run(**ex.identity, effect=effect)
        except NotStored as ns:
            return ns.response
        return ex.ran(result)

    def _external(self, ex: Exchange, handler: Handler) -> HttpResponse:
        store = self.store
        outcome = self._retrying(lambda conn: store.claim(conn, **ex.identity, lease=self.policy.lease))
        if not isinstance(outcome, Claimed):
            return ex.unclaimed(outcome)
        try:
            with ex.handling():
                resp = handler(None)
        except BaseException:
            self._release(outcome)
            raise  # the handler's own error, unchanged
        body = ex.to_store(resp)
        if body is None:
            self._release(outcome)
        else:
            self._retrying(lambda conn: store.complete(conn, outcome, body, resp.status))
        return resp

    def _release(self, claimed: Claimed) -> None:
        try:
            self._retrying(lambda conn: self.store.release(conn, claimed))
        except Exception:  # the lease ends on its own; the handler's outcome matters more
            pass

    def _retrying(self, step: Callable[[Connection], Any]) -> Any:
        def once() -> Any:
            with self.store.transaction() as conn:
                return step(conn)
        return call_with_retry(self.store.retry, self.store.retry_cause, once)
