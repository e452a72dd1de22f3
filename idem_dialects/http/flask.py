"""A Flask view decorator on the sync IdempotencyStore (imports Flask; install the [flask] extra)::

    idempotent = idempotent_view(store, IdempotencyPolicy(scope=lambda r: r.header("x-account")))

    @app.post("/payments")
    @idempotent
    def pay():
        current_connection().execute(...)     # atomic mode: the record's transaction
        return {"id": 7}, 201, {"Location": "/payments/7"}

A view that raises leaves nothing behind: its writes roll back with the claim, and Flask answers the error as usual.
An HTTP exception (`abort(402)`, a werkzeug `HTTPException`) is the view's answer: its writes roll back too, and the
app's error handler makes the response, stored by its status in a transaction of its own (see
`idem_dialects.http.core`). Under the WSGI
middleware on the same store, the decorator passes the request through (the middleware holds the claim) and tells it
the view ran, so what it answers is the view's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import flask
from werkzeug.exceptions import HTTPException

from ..api import StoreAPI
from .bodies import is_event_stream, response_body, streamed
from .core import Admission, Raised, entry, note_raised, raised_in, routed
from .policy import HttpRequest, IdempotencyPolicy
from .problems import HttpResponse
from .runner import Idempotency

__all__ = ["idempotent_view"]  # public: the API reference documents each

F = TypeVar("F", bound=Callable[..., Any])


def request_from_flask(req: flask.Request, max_bytes: int) -> HttpRequest:
    too_large = (req.content_length or 0) > max_bytes
    body = b"" if too_large else req.get_data(cache=True)  # a chunked body too (werkzeug reads it to its end)
    too_large = too_large or len(body) > max_bytes
    return HttpRequest(method=req.method, path=req.path, headers=[(k.lower(), v) for k, v in req.headers.items()],
                       native=req, body=body, body_too_large=too_large, query=req.query_string.decode("latin-1"),
                       context=req.environ, route=True)


def idempotent_view(store: StoreAPI[Any], policy: IdempotencyPolicy) -> Callable[[F], F]:
    """A decorator making Flask views idempotent under `policy` (methods outside `policy.methods` pass through)."""
    idempotency = Idempotency(store, policy)

    def decorate(view: F) -> F:
        def answer(*args: Any, **kwargs: Any) -> flask.Response:
            """The view's answer, an HTTP exception's included (as Flask's error handlers make it)."""
            try:
                rv = view(*args, **kwargs)
            except HTTPException as exc:
                note_raised(flask.request.environ)
                rv = flask.current_app.handle_http_exception(exc)
            return flask.make_response(rv)

        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> flask.Response:
            req = flask.request
            met = entry(policy, idempotency.identity, req.method, req.path, policy.header in req.headers, req.environ)
            if met is Admission.PASS:
                return flask.make_response(view(*args, **kwargs))
            if met is Admission.OUTSIDE:  # the WSGI middleware on this store holds the claim
                marks = routed(req.environ)
                passed = answer(*args, **kwargs)
                if marks is not None:
                    marks.began = True
                return passed

            streams: list[flask.Response] = []

            def handler(conn: object) -> HttpResponse:
                rv = answer(*args, **kwargs)
                if rv.is_streamed and is_event_stream(list(rv.headers.items())):  # passed on, not stored
                    streams.append(rv)
                    return streamed(req.method, req.path, rv.status_code, [])
                body = response_body(rv.get_data(), policy.max_response_bytes)
                out = HttpResponse(rv.status_code, list(rv.headers.items()), body)
                if raised_in(req.environ):
                    raise Raised(out)  # its writes roll back; the answer is stored on its own
                return out

            resp = idempotency.handle(request_from_flask(req, policy.max_request_bytes), handler)
            if resp.streamed:
                return streams[0]
            return flask.Response(resp.body, status=resp.status, headers=resp.headers)

        return cast(F, wrapper)

    return decorate
