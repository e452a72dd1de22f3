"""ASGI middleware (Starlette, FastAPI or any ASGI app) on the async store. Imports no framework.

    app.add_middleware(IdempotencyMiddleware, store=store, policy=IdempotencyPolicy(scope=account_of))

In atomic mode the handler finds the record's AsyncConnection in `request.state.idem_connection` (the ASGI scope's
"state"), through `idem_dialects.http.current_connection()`, or with the FastAPI dependency `IdemConnection`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any

from ..api import AsyncStoreAPI
from .bodies import Buffer, declared_too_large, is_event_stream, streamed
from .core import Admission, Passage, Raised, entry, passage, raised_in, wire_headers
from .policy import HttpRequest, IdempotencyPolicy
from .problems import HttpResponse
from .runner import AsyncIdempotency

__all__ = ["IdempotencyMiddleware"]  # public: the API reference documents each

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
STATE_KEY = "idem_connection"


def decode_headers(raw: Any) -> list[tuple[str, str]]:
    return [(bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1")) for k, v in raw]


def has_key(policy: IdempotencyPolicy, headers: list[tuple[str, str]]) -> bool:
    name = policy.header.lower()
    return any(k == name for k, _ in headers)


class Disconnected(Exception):
    """The client went away before its request body was complete: nothing to claim, nothing to answer."""


async def read_body(receive: Receive, limit: int) -> tuple[bytes, bool]:
    """The request body, or (b"", True) once it is over `limit` (the request is then refused)."""
    buffer = Buffer(limit)
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Disconnected
        if not buffer.add(message.get("body", b"")):
            return b"", True
        if not message.get("more_body", False):
            return buffer.body(), False  # one message, most bodies: its bytes as they came


async def run_asgi(app: ASGIApp, scope: Scope, receive: Receive, send: Send, body: bytes, limit: int, conn: Any
                   ) -> HttpResponse:
    """Call `app` with the buffered body and collect its whole response (BodyOverLimit past `limit`); the
    middleware's handler, `conn` last (a partial of it: no closure per request). Server-sent events go to `send` as
    they come instead (`core.streamed`)."""
    inner = _Watched(scope)
    if conn is not None:
        inner["state"] = dict(scope.get("state") or {}, **{STATE_KEY: conn})
    delivered = False

    async def replay_receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body, only http.disconnect can come

    start: dict[str, Any] = {}
    buffer = Buffer(limit)
    passing = False  # server-sent events: passed on as they come

    async def capture(message: Message) -> None:
        nonlocal passing
        if passing:
            await send(message)
        elif message["type"] == "http.response.start":
            start.update(message)
            passing = is_event_stream(decode_headers(start.get("headers", [])))
            if passing:
                await send(message)
        elif message["type"] == "http.response.body":
            buffer.keep(message.get("body", b""))

    await app(inner, replay_receive, capture)
    if not start:
        raise RuntimeError("the ASGI application returned without starting a response")
    if passing:
        return streamed(scope["method"], scope["path"], int(start["status"]), [])
    resp = captured(int(start["status"]), start.get("headers", []), buffer.body())
    if raised_in(inner):
        raise Raised(resp)  # its writes roll back; the answer is stored on its own
    return resp


# Where Starlette's ExceptionMiddleware leaves the app's exception handlers, for its routes to answer with.
_HANDLERS = "starlette.exception_handlers"


class _Watched(dict[str, Any]):
    """The scope the app gets: exception handlers an app's ExceptionMiddleware (Starlette, FastAPI) leaves in it note,
    when one answers, that the handler raised (`core.note_raised`), since this layer sees only the answer."""

    def __setitem__(self, key: str, value: Any) -> None:
        if key == _HANDLERS and isinstance(value, tuple) and len(value) == 2:
            # The handlers hold the request's passage, not this scope: the scope holds them, and a scope they held
            # would be a reference cycle per request (the scope, its state, the record's connection freed only by
            # a garbage collection).
            found = passage(self)
            assert found is not None
            value = (_Noting(value[0], found), _Noting(value[1], found))
        super().__setitem__(key, value)


class _Noting(dict[Any, Any]):
    """Exception handlers (by class or by status) that note their call in the request's passage."""

    def __init__(self, handlers: dict[Any, Any], found: Passage) -> None:
        super().__init__(handlers)
        self._passage = found

    def __getitem__(self, key: Any) -> Any:
        return _noting(super().__getitem__(key), self._passage)

    def get(self, key: Any, default: Any = None) -> Any:
        return _noting(super().__getitem__(key), self._passage) if key in self else default


def _noting(handler: Callable[..., Any], found: Passage) -> Callable[..., Any]:
    """`handler`, noting its call as `core.note_raised` does."""
    if _is_async(handler):
        async def noted_async(*args: Any) -> Any:
            found.raised = True
            return await handler(*args)

        return noted_async

    def noted(*args: Any) -> Any:
        found.raised = True
        return handler(*args)

    return noted


def _is_async(handler: Any) -> bool:
    """As Starlette decides whether to await a handler (or run it in its thread pool)."""
    while isinstance(handler, partial):
        handler = handler.func
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__)


def captured(status: int, raw: Any, body: bytes) -> HttpResponse:
    """An app's response as the core sees it, its head kept as the app sent it too (lower-cased), to go out as is."""
    wire = [(bytes(k).lower(), bytes(v)) for k, v in raw]
    return HttpResponse(status, [(k.decode("latin-1"), v.decode("latin-1")) for k, v in wire], body, raw=wire)


async def send_response(resp: HttpResponse, send: Send) -> None:
    await send({"type": "http.response.start", "status": resp.status, "headers": wire_headers(resp)})
    await send({"type": "http.response.body", "body": resp.body, "more_body": False})


class IdempotencyMiddleware:
    """Wrap an ASGI app: requests the policy selects are claimed, run once, stored and replayed."""

    def __init__(self, app: ASGIApp, store: AsyncStoreAPI[Any],
                 policy: IdempotencyPolicy) -> None:
        self.app = app
        self.policy = policy
        self.idempotency = AsyncIdempotency(store, policy)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        policy = self.policy
        if scope["type"] != "http" or not policy.applies(scope["method"], scope["path"]):
            return await self.app(scope, receive, send)  # most requests: decided before the headers are decoded
        headers = decode_headers(scope.get("headers", []))
        if entry(policy, self.idempotency.identity, scope["method"], scope["path"], has_key(policy, headers),
                 scope) is not Admission.CLAIM:
            return await self.app(scope, receive, send)  # not this layer's, or an outer layer on this store has it
        scope = dict(scope)  # the caller's scope stays as it was (ASGI); this layer's notes go in the copy
        too_large = declared_too_large(policy, next((v for k, v in headers if k == "content-length"), None))
        try:
            body, over = (b"", True) if too_large else await read_body(receive, policy.max_request_bytes)
        except Disconnected:
            return None
        req = HttpRequest(method=scope["method"], path=scope["path"], headers=headers, native=scope, body=body,
                          body_too_large=over, query=bytes(scope.get("query_string", b"")).decode("latin-1"),
                          context=scope)
        handler = partial(run_asgi, self.app, scope, receive, send, body, policy.max_response_bytes)
        answer = await self.idempotency.handle(req, handler)
        if not answer.streamed:  # a stream went out as it came
            await send_response(answer, send)
