"""WSGI middleware (Flask, Django or any WSGI app) on the sync IdempotencyStore.

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, store, IdempotencyPolicy(scope=account_of))

In atomic mode the handler finds the record's transaction connection in `environ["idem_dialects.connection"]` and
through `idem_dialects.http.current_connection()`.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from types import TracebackType
from typing import Any

from sqlalchemy.engine import Connection

from ..api import StoreAPI
from .bodies import Buffer, is_event_stream, streamed
from .core import Admission, entry
from .policy import HttpRequest, IdempotencyPolicy
from .problems import HttpResponse
from .runner import Idempotency

__all__ = ["IdempotencyMiddleware"]  # public: the API reference documents each

Environ = dict[str, Any]
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
CONNECTION_KEY = "idem_dialects.connection"


def read_body(environ: Environ, max_bytes: int) -> tuple[bytes, bool]:
    """The request body and whether it is over `max_bytes` (then b"": it is refused, and not read further).

    With a Content-Length, that many bytes. Without one, a server that ends the input stream itself
    (`wsgi.input_terminated`: gunicorn, werkzeug and others for a chunked body) is read to its end, up to the limit;
    PEP 3333 allows no other read past a missing Content-Length."""
    stream = environ["wsgi.input"]
    declared = environ.get("CONTENT_LENGTH")
    if declared:
        try:
            length = int(declared)
        except ValueError:
            length = 0
        if length > max_bytes:
            return b"", True
        return (stream.read(length) if length > 0 else b""), False
    if not environ.get("wsgi.input_terminated"):
        return b"", False
    buffer = Buffer(max_bytes)
    while chunk := stream.read(min(65536, max_bytes + 1 - buffer.size)):
        if not buffer.add(chunk):
            return b"", True
    return buffer.body(), False


def request_from_environ(environ: Environ, max_bytes: int) -> HttpRequest:
    """The core's view of a WSGI request; reads the body unless it is over `max_bytes`."""
    headers = [(k[5:].replace("_", "-").lower(), str(v)) for k, v in environ.items() if k.startswith("HTTP_")]
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            headers.append((key.replace("_", "-").lower(), str(environ[key])))
    body, too_large = read_body(environ, max_bytes)
    return HttpRequest(method=str(environ.get("REQUEST_METHOD", "GET")).upper(),
                       path=str(environ.get("SCRIPT_NAME", "")) + str(environ.get("PATH_INFO", "")),
                       headers=headers, native=environ, body=body, body_too_large=too_large,
                       query=str(environ.get("QUERY_STRING", "")), context=environ)


def run_wsgi(app: WSGIApp, environ: Environ, body: bytes, limit: int,
             passed: list[Iterable[bytes]] | None = None) -> HttpResponse:
    """Call `app` with the buffered body and collect its whole response (BodyOverLimit past `limit`). With
    `passed`, a response of server-sent events is not collected: its iterable goes there, to be passed on as the app
    streams it (`core.streamed`)."""
    env = dict(environ)
    env["wsgi.input"] = io.BytesIO(body)
    env["CONTENT_LENGTH"] = str(len(body))
    env.pop("HTTP_TRANSFER_ENCODING", None)  # the buffered body has a length now, chunked or not before
    buffer = Buffer(limit)
    started: list[tuple[str, list[tuple[str, str]]]] = []
    add = buffer.keep

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: ExcInfo | None = None
                       ) -> Callable[[bytes], object]:
        if exc_info is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [(status, list(headers))]
        return add

    result = app(env, start_response)
    if passed is not None and started and is_event_stream(started[0][1]):
        passed.append(result)
        status, headers = started[0]
        return streamed(env.get("REQUEST_METHOD", "GET"), str(env.get("SCRIPT_NAME", "")) +
                        str(env.get("PATH_INFO", "")), int(status.split(" ", 1)[0]), headers)
    try:
        for chunk in result:
            add(chunk)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    if not started:
        raise RuntimeError("the WSGI application returned without calling start_response")
    status, headers = started[0]
    return HttpResponse(int(status.split(" ", 1)[0]), headers, buffer.body())


def send(resp: HttpResponse, start_response: StartResponse) -> Iterator[bytes]:
    headers = list(resp.headers)
    if resp.header("content-length") is None:
        headers.append(("content-length", str(len(resp.body))))
    start_response(status_line(resp.status), headers)
    yield resp.body


def status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


class IdempotencyMiddleware:
    """Wrap a WSGI app: requests the policy selects are claimed, run once, stored and replayed."""

    def __init__(self, app: WSGIApp, store: StoreAPI[Any], policy: IdempotencyPolicy) -> None:
        self.app = app
        self.idempotency = Idempotency(store, policy)
        self.policy = policy

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET"))
        path = str(environ.get("SCRIPT_NAME", "")) + str(environ.get("PATH_INFO", ""))
        header = "HTTP_" + self.policy.header.upper().replace("-", "_")
        admitted = entry(self.policy, self.idempotency.identity, method, path, header in environ, environ)
        if admitted is not Admission.CLAIM:
            return self.app(environ, start_response)  # not this layer's, or an outer layer on this store has it
        req = request_from_environ(environ, self.policy.max_request_bytes)

        passed: list[Iterable[bytes]] = []

        def handler(conn: Connection | None) -> HttpResponse:
            env = dict(environ)
            if conn is not None:
                env[CONNECTION_KEY] = conn
            return run_wsgi(self.app, env, req.body, self.policy.max_response_bytes, passed)

        # The handler's own error propagates unchanged to the server (after the transaction rolled back).
        answer = self.idempotency.handle(req, handler)
        if answer.streamed:  # the app's own iterable, read by the server as it streams
            start_response(status_line(answer.status), answer.headers)
            return passed[0]
        return send(answer, start_response)
