"""One idempotent request, as a protocol flow: what the sync and async runners (`runner.py`) execute alike.

Atomic mode: the store's `run` flow claims, calls the handler with the record's connection (an `Effect` step) and
stores the response in the same transaction, so the handler's writes and the record commit together or not at all.
An answer the handler gave by raising (`core.Raised`) rolls its writes back; a response too large to store (over the
policy's limit, or over the database's statement limit) rolls back too. Either answer is then stored for the key in
a transaction of its own (the latter as the `response-too-large` problem), so a retry replays it and runs nothing.
External-call mode (`policy.lease`): the claim commits alone, the handler runs outside any transaction, then the
response is stored in a short transaction of its own, or the claim is released if the handler failed or its answer
is not one a retry should see. Once the handler has returned, nothing releases the claim: a response too large to
store (by either limit) is completed as the `response-too-large` problem, so a retry gets that instead of running
the handler again.

A request a layer further out already claimed on the same store, or whose key it claimed through any store, passes
through untouched: claiming it again would wait on that layer's own claim (see `core.Passage`).
"""

from __future__ import annotations

import logging
from typing import Any

from ..api import ClaimFlows
from ..claims import Reply
from ..core import Request
from ..errors import IdemError, ResponseTooLarge
from ..outcomes import Claimed
from ..steps import Begin, Effect, Flow, transaction
from ..telemetry import REQUEST_SPAN
from .bodies import BodyOverLimit
from .core import (
    Call,
    HandlerErrors,
    NotStored,
    Raised,
    claimed_outside,
    encode_stored,
    keeps,
    note_claim,
    outcome_response,
    prepare,
    replay_response,
    routed,
    too_large,
    too_large_after_acting,
)
from .policy import HttpRequest, IdempotencyPolicy
from .problems import HttpResponse

log = logging.getLogger("idem_dialects")


def exchange(claims: ClaimFlows, store: str, policy: IdempotencyPolicy, req: HttpRequest,
             errors: HandlerErrors) -> Flow[HttpResponse]:
    """The answer to `req`: the handler's response (an `Effect` step), a replay, or a problem, on the store whose
    `claims` these are and whose identity is `store` (`core.store_identity`). `errors` holds what the handler raised,
    which is re-raised unchanged, never turned into a problem."""
    try:
        outside = claimed_outside(req.context, store)
        prepared = None if outside else prepare(policy, req)
        if outside or (isinstance(prepared, Call) and claimed_outside(req.context, store, prepared)):
            marks = routed(req.context) if req.route else None
            inner: HttpResponse = yield Effect()  # an outer layer holds the claim and stores what this returns
            if marks is not None:
                marks.began = True  # the route's own handler answered it
            return inner
        if prepared is None:
            passed: HttpResponse = yield Effect()  # not an idempotent request: the handler, untouched
            return passed
        if isinstance(prepared, HttpResponse):
            return prepared
        note_claim(req.context, store, prepared)  # before the handler runs: the layers inside it pass it through
        # A span per idempotent request: a child of the server span the framework's instrumentation made current.
        answer = (_atomic if policy.lease is None else _external)(claims, policy, req, prepared, errors)
        return (yield from claims.span(REQUEST_SPAN, prepared.operation, answer, _described))
    finally:
        # The handler's own error leaves with these frames in its traceback, and `errors` is held by them: kept in it,
        # the error would be a reference cycle per failed request (its traceback's frames, their locals, the
        # request), freed only by a garbage collection.
        errors.forget()


def _described(resp: HttpResponse) -> dict[str, Any]:
    return {"http.response.status_code": resp.status}


class _Kept:
    """The atomic effect's `on_effect`: what is stored for the handler's response (NotStored rolls it back)."""

    __slots__ = ("policy", "req", "response")

    def __init__(self, policy: IdempotencyPolicy, req: HttpRequest) -> None:
        self.policy, self.req = policy, req
        self.response: HttpResponse | None = None  # this request's own, answered as the handler made it

    def __call__(self, resp: HttpResponse) -> Reply:
        if resp.streamed or not keeps(self.policy, self.req, resp.status):
            raise NotStored(resp)  # rolls the claim and the handler's writes back
        self.response = resp
        return Reply(encode_stored(self.policy, resp), resp.status)


def _atomic(claims: ClaimFlows, policy: IdempotencyPolicy, req: HttpRequest, call: Call, errors: HandlerErrors
            ) -> Flow[HttpResponse]:
    kept = _Kept(policy, req)
    try:
        result = yield from claims.run(scope=call.scope, operation=call.operation, key=call.key,
                                       request=call.request, on_effect=kept, on_in_flight=policy.on_in_flight)
        if result.replayed:
            return replay_response(policy, call, result.response, result.status)
    except NotStored as ns:
        return ns.response
    except Raised as raised:  # the handler's writes rolled back with the claim
        if not keeps(policy, req, raised.response.status):
            return raised.response
        return (yield from _kept_apart(claims, policy, call, raised.response))
    except (BodyOverLimit, IdemError) as exc:
        if _too_large(exc, errors):  # rolled back too: the key keeps the problem, no retry runs the handler again
            return (yield from _kept_apart(claims, policy, call, too_large(policy)))
        return errors.answer(policy, exc)
    assert kept.response is not None
    return kept.response


def _too_large(exc: BaseException, errors: HandlerErrors) -> bool:
    """A response over the policy's limit, or over what the database takes in one statement (not the handler's own
    error of that type)."""
    return isinstance(exc, BodyOverLimit) or (isinstance(exc, ResponseTooLarge) and not errors.own(exc))


def _kept_apart(claims: ClaimFlows, policy: IdempotencyPolicy, call: Call, resp: HttpResponse
                ) -> Flow[HttpResponse]:
    """`resp`, this request's answer, stored for its key in a transaction of its own after the handler's writes
    rolled back: every retry replays it and none runs the handler. If another request claimed the key meanwhile (a
    duplicate waiting on this one's claim), that one's answer is the key's; this request still gets its own."""
    req = claims.request(call.scope, call.operation, call.key, call.request)
    body = encode_stored(policy, resp)
    try:
        yield from claims.retrying(lambda: transaction(_complete_now(claims, req, body, resp.status), Begin.CLAIM))
    except IdemError as exc:  # the answer still goes out; a retry then runs the handler again
        log.warning("could not store the %d answer for key %r in %r/%r: %s", resp.status, call.key, call.scope,
                    call.operation, type(exc).__name__)
    return resp


def _complete_now(claims: ClaimFlows, req: Request, body: bytes, status: int) -> Flow[None]:
    outcome = yield from claims.claim(req, fresh=True)
    if isinstance(outcome, Claimed):
        yield from claims.complete(outcome, body, status)


def _external(claims: ClaimFlows, policy: IdempotencyPolicy, http: HttpRequest, call: Call, errors: HandlerErrors
              ) -> Flow[HttpResponse]:
    try:
        return (yield from _leased(claims, policy, http, call))
    except (BodyOverLimit, IdemError) as exc:
        return errors.answer(policy, exc)


def _leased(claims: ClaimFlows, policy: IdempotencyPolicy, http: HttpRequest, call: Call) -> Flow[HttpResponse]:
    req = claims.request(call.scope, call.operation, call.key, call.request, policy.lease)
    outcome = yield from claims.retrying(lambda: transaction(claims.claim(req, fresh=True), Begin.CLAIM))
    if not isinstance(outcome, Claimed):
        answer = outcome_response(policy, call, outcome)
        assert answer is not None
        return answer
    try:
        assert req.lease is not None
        resp: HttpResponse = yield Effect(claims.heartbeat(outcome, req.lease))  # the lease renewed meanwhile
    except BodyOverLimit:
        # The handler returned (it has acted); only its answer is too large to keep: keep this one instead.
        resp, kept = too_large_after_acting(policy), True
    except Raised as raised:  # an answer, raised: its writes are its own (no transaction of ours holds them)
        resp = raised.response
        kept = keeps(policy, http, resp.status)
    except BaseException as exc:
        yield from claims.release_after(outcome, exc)
        raise  # the handler's own error, unchanged
    else:
        kept = not resp.streamed and keeps(policy, http, resp.status)
    if not kept:
        yield from _release(claims, outcome)
        return resp
    try:
        yield from _complete(claims, policy, outcome, resp)
    except ResponseTooLarge:  # under the policy's limit, over the database's: the handler has acted all the same
        resp = too_large_after_acting(policy)
        yield from _complete(claims, policy, outcome, resp)
    return resp


def _complete(claims: ClaimFlows, policy: IdempotencyPolicy, claimed: Claimed, resp: HttpResponse) -> Flow[None]:
    body = encode_stored(policy, resp)
    yield from claims.retrying(lambda: transaction(claims.complete(claimed, body, resp.status)))


def _release(claims: ClaimFlows, claimed: Claimed) -> Flow[None]:
    try:
        yield from claims.retrying(lambda: transaction(claims.release(claimed)))
    except Exception:  # the lease ends on its own; the handler's outcome matters more
        pass
