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
        errors = HandlerErrors()

        def tracked(conn: Connection | None) -> HttpResponse:
            try:
                return handler(conn)
            except BaseException as exc:
                errors.note(exc)
                raise

        try:
            if self.policy.lease is None:
                return self._atomic(prepared, tracked)
            return self._external(prepared, tracked)
        except (ResponseTooLarge, IdemError) as exc:
            return errors.answer(self.policy, exc)

    def _atomic(self, call: Call, handler: Handler) -> HttpResponse:
        first: list[HttpResponse] = []

        def effect(conn: Connection) -> Reply:
            token = _connection.set(conn)
            try:
                resp = handler(conn)
            finally:
                _connection.reset(token)
            return stored_reply(self.policy, resp, first)

        try:
            result = self.store.run(scope=call.scope, operation=call.operation, key=call.key,
                                    request=call.request, effect=effect)
        except NotStored as ns:
            return ns.response
        if result.replayed:
            return replay_response(self.policy, call, result.response, result.status)
        return first[0]

    def _external(self, call: Call, handler: Handler) -> HttpResponse:
        store, policy = self.store, self.policy
        outcome = self._retrying(lambda conn: store.claim(conn, scope=call.scope, operation=call.operation,
                                                          key=call.key, request=call.request, lease=policy.lease))
        answer = outcome_response(policy, call, outcome)
        if answer is not None:
            return answer
        assert isinstance(outcome, Claimed)
        try:
            resp = handler(None)
        except BaseException:
            self._release(outcome)
            raise  # the handler's own error, unchanged
        if not policy.store_status(resp.status):
            self._release(outcome)
            return resp
        body = encode_stored(policy, resp)
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
