"""One idempotent request, as a protocol flow: what the sync and async runners (`runner.py`) execute alike.

Atomic mode: the store's `run` flow claims, calls the handler with the record's connection (an `Effect` step) and
stores the response in the same transaction, so the handler's writes and the record commit together or not at all.
External-call mode (`policy.lease`): the claim commits alone, the handler runs outside any transaction, then the
response is stored in a short transaction of its own, or the claim is released if the handler failed or its answer
is not one a retry should see. Once the handler has returned, nothing releases the claim: a response too large to
store is completed as the `response-too-large` problem, so a retry gets that instead of running the handler again.

A request a layer further out already claimed on the same store, or whose key it claimed through any store, passes
through untouched: claiming it again would wait on that layer's own claim (see `core.Passage`).
"""

from __future__ import annotations

from typing import Any

from ..api import ClaimFlows
from ..claims import Reply
from ..errors import IdemError
from ..outcomes import Claimed
from ..steps import Begin, Effect, Flow, transaction
from ..telemetry import REQUEST_SPAN
from .core import (
    Call,
    HandlerErrors,
    NotStored,
    ResponseTooLarge,
    claimed_outside,
    encode_stored,
    keeps,
    note_claim,
    outcome_response,
    prepare,
    replay_response,
    routed,
    too_large_after_acting,
)
from .policy import HttpRequest, IdempotencyPolicy
from .problems import HttpResponse


def exchange(claims: ClaimFlows, store: str, policy: IdempotencyPolicy, req: HttpRequest,
             errors: HandlerErrors) -> Flow[HttpResponse]:
    """The answer to `req`: the handler's response (an `Effect` step), a replay, or a problem, on the store whose
    `claims` these are and whose identity is `store` (`core.store_identity`). `errors` holds what the handler raised,
    which is re-raised unchanged, never turned into a problem."""
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


def _described(resp: HttpResponse) -> dict[str, Any]:
    return {"http.response.status_code": resp.status}


class _Kept:
    """The atomic effect's `on_effect`: what is stored for the handler's response (NotStored rolls it back)."""

    __slots__ = ("policy", "req", "response")

    def __init__(self, policy: IdempotencyPolicy, req: HttpRequest) -> None:
        self.policy, self.req = policy, req
        self.response: HttpResponse | None = None  # this request's own, answered as the handler made it

    def __call__(self, resp: HttpResponse) -> Reply:
        if not keeps(self.policy, self.req, resp.status):
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
    except (ResponseTooLarge, IdemError) as exc:
        return errors.answer(policy, exc, claims.features)
    assert kept.response is not None
    return kept.response


def _external(claims: ClaimFlows, policy: IdempotencyPolicy, http: HttpRequest, call: Call, errors: HandlerErrors
              ) -> Flow[HttpResponse]:
    try:
        return (yield from _leased(claims, policy, http, call))
    except (ResponseTooLarge, IdemError) as exc:
        return errors.answer(policy, exc, claims.features)


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
    except ResponseTooLarge:
        # The handler returned (it has acted); only its answer is too large to keep: keep this one instead.
        resp = too_large_after_acting(policy)
    except BaseException as exc:
        yield from claims.release_after(outcome, exc)
        raise  # the handler's own error, unchanged
    else:
        if not keeps(policy, http, resp.status):
            yield from _release(claims, outcome)
            return resp
    body = encode_stored(policy, resp)
    yield from claims.retrying(lambda: transaction(claims.complete(outcome, body, resp.status)))
    return resp


def _release(claims: ClaimFlows, claimed: Claimed) -> Flow[None]:
    try:
        yield from claims.retrying(lambda: transaction(claims.release(claimed)))
    except Exception:  # the lease ends on its own; the handler's outcome matters more
        pass
