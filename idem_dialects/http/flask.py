"""A Flask view decorator on the sync IdempotencyStore (imports Flask; install the [http] extra).

    idempotent = idempotent_view(store, IdempotencyPolicy(scope=lambda r: r.header("x-account")))

    @app.post("/payments")
    @idempotent
    def pay():
        current_connection().execute(...)     # atomic mode: the record's transaction
        return {"id": 7}, 201, {"Location": "/payments/7"}

A view that raises (or calls `abort`) leaves nothing behind: its writes roll back with the claim, and Flask answers
the error as usual; such responses are not stored. Under the WSGI middleware on the same store, the decorator passes
the request through (the middleware holds the claim) and tells it the view ran, so what it answers is the view's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import flask

from ..store import IdempotencyStore
from .core import HttpRequest, IdempotencyPolicy, ResponseTooLarge, claimed_outside, routed
from .problems import HttpResponse
from .runner import Idempotency

F = TypeVar("F", bound=Callable[..., Any])


def request_from_flask(req: flask.Request, max_bytes: int) -> HttpRequest:
    too_large = (req.content_length or 0) > max_bytes
    body = b"" if too_large else req.get_data(cache=True)  # a chunked body too (werkzeug reads it to its end)
    too_large = too_large or len(body) > max_bytes
    return HttpRequest(method=req.method, path=req.path, headers=[(k.lower(), v) for k, v in req.headers.items()],
                       native=req, body=body, body_too_large=too_large, query=req.query_string.decode("latin-1"),
                       context=req.environ, route=True)


def idempotent_view(store: IdempotencyStore, policy: IdempotencyPolicy) -> Callable[[F], F]:
    """A decorator making Flask views idempotent under `policy` (methods outside `policy.methods` pass through)."""
    idempotency = Idempotency(store, policy)

    def decorate(view: F) -> F:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> flask.Response:
            req = flask.request
            keyless = not policy.require_key and policy.header not in req.headers
            if not policy.applies(req.method, req.path) or keyless:
                return flask.make_response(view(*args, **kwargs))
            if claimed_outside(req.environ, idempotency.identity):  # the WSGI middleware on this store holds the claim
                marks = routed(req.environ)
                passed = flask.make_response(view(*args, **kwargs))
                if marks is not None:
                    marks.began = True
                return passed

            def handler(conn: object) -> HttpResponse:
                rv = flask.make_response(view(*args, **kwargs))
                if (rv.content_length or 0) > policy.max_response_bytes:
                    raise ResponseTooLarge(rv.content_length)
                body = rv.get_data()
                if len(body) > policy.max_response_bytes:
                    raise ResponseTooLarge(len(body))
                return HttpResponse(rv.status_code, list(rv.headers.items()), body)

            resp = idempotency.handle(request_from_flask(req, policy.max_request_bytes), handler)
            return flask.Response(resp.body, status=resp.status, headers=resp.headers)

        return cast(F, wrapper)

    return decorate
