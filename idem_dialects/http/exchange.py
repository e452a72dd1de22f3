"""One idempotent request, as a protocol flow: what the sync and async runners (`runner.py`) execute alike.

Atomic mode: the store's `run` flow claims, calls the handler with the record's connection (an `Effect` step) and
stores the response in the same transaction, so the handler's writes and the record commit together or not at all.
External-call mode (`policy.lease`): the claim commits alone, the handler runs outside any transaction, then the
response is stored in a short transaction of its own, or the claim is released if the handler failed or its answer
is not one a retry should see. Once the handler has returned, nothing releases the claim: a response too large to
store is completed as the `response-too-large` problem, so a retry gets that instead of running the handler again.

A request a layer further out already claimed on the same store passes through untouched: claiming it again would
wait on that layer's own claim (see `core.Passage`).
"""

from __future__ import annotations

from typing import Any

from ..errors import IdemError
from ..outcomes import Claimed
from ..protocol import Core, Reply
from ..steps import Begin, Effect, Flow, transaction
from ..telemetry import REQUEST_SPAN
from .core import (
    Call,
    HandlerErrors,
    HttpRequest,
    IdempotencyPolicy,
    NotStored,
    ResponseTooLarge,
    claimed_outside,
    encode_stored,
    keeps,
    outcome_response,
    passage,
    prepare,
    replay_response,
    routed,
    store_identity,
    too_large_after_acting,
)
from .problems import HttpResponse


def exchange(core: Core, policy: IdempotencyPolicy, req: HttpRequest, errors: HandlerErrors) -> Flow[HttpResponse]:
    """The answer to `req`: the handler's response (an `Effect` step), a replay, or a problem. `errors` holds what
    the handler raised, which is re-raised unchanged, never turned into a problem."""
    store = store_identity(core.engine.url, core.table_prefix)
    if claimed_outside(req.context, store):
        marks = routed(req.context) if req.route else None
        inner: HttpResponse = yield Effect()  # an outer layer holds the claim and stores what this returns
        if marks is not None:
            marks.began = True  # the route's own handler answered it
        return inner
    prepared = prepare(policy, req)
    if prepared is None:
        passed: HttpResponse = yield Effect()  # not an idempotent request: the handler, untouched
        return passed
    if isinstance(prepared, HttpResponse):
        return prepared
    marks = passage(req.context)
    if marks is not None:
        marks.claimed.add(store)  # before the handler runs: the layers inside it pass the request through
    # A span per idempotent request: a child of the server span the framework's instrumentation made current.
    answer = _answer(core, policy, req, prepared, errors)
    return (yield from core.telemetry.span(REQUEST_SPAN, prepared.operation, answer, _described))


def _answer(core: Core, policy: IdempotencyPolicy, req: HttpRequest, call: Call, errors: HandlerErrors
            ) -> Flow[HttpResponse]:
    try:
        if policy.lease is None:
            return (yield from _atomic(core, policy, req, call))
        return (yield from _external(core, policy, req, call))
    except (ResponseTooLarge, IdemError) as exc:
        return errors.answer(policy, exc)


def _described(resp: HttpResponse) -> dict[str, Any]:
    return {"http.response.status_code": resp.status}


def _identity(call: Call) -> dict[str, Any]:
    return {"scope": call.scope, "operation": call.operation, "key": call.key, "request": call.request}


def _atomic(core: Core, policy: IdempotencyPolicy, req: HttpRequest, call: Call) -> Flow[HttpResponse]:
    handled: list[HttpResponse] = []  # this request's own response, answered as the handler made it

    def stored(resp: HttpResponse) -> Reply:
        if not keeps(policy, req, resp.status):
            raise NotStored(resp)  # rolls the claim and the handler's writes back
        handled[:] = [resp]
        return Reply(encode_stored(policy, resp), resp.status)

    try:
        result = yield from core.run(**_identity(call), on_effect=stored, on_in_flight=policy.on_in_flight)
    except NotStored as ns:
        return ns.response
    if result.replayed:
        return replay_response(policy, call, result.response, result.status)
    return handled[0]


def _external(core: Core, policy: IdempotencyPolicy, http: HttpRequest, call: Call) -> Flow[HttpResponse]:
    req = core.request(call.scope, call.operation, call.key, call.request, policy.lease)
    outcome = yield from core.retrying(lambda: transaction(core.claim(req), Begin.CLAIM))
    if not isinstance(outcome, Claimed):
        answer = outcome_response(policy, call, outcome)
        assert answer is not None
        return answer
    try:
        assert req.lease is not None
        resp: HttpResponse = yield Effect(core.heartbeat(outcome, req.lease))  # the lease renewed meanwhile
    except ResponseTooLarge:
        # The handler returned (it has acted); only its answer is too large to keep: keep this one instead.
        resp = too_large_after_acting(policy)
    except BaseException as exc:
        yield from core.release_after(outcome, exc)
        raise  # the handler's own error, unchanged
    else:
        if not keeps(policy, http, resp.status):
            yield from _release(core, outcome)
            return resp
    body = encode_stored(policy, resp)
    yield from core.retrying(lambda: transaction(core.complete(outcome, body, resp.status)))
    return resp


def _release(core: Core, claimed: Claimed) -> Flow[None]:
    try:
        yield from core.retrying(lambda: transaction(core.release(claimed)))
    except Exception:  # the lease ends on its own; the handler's outcome matters more
        pass
