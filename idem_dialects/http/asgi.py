"""ASGI middleware (Starlette, FastAPI or any ASGI app) on the async store. Imports no framework.

    app.add_middleware(IdempotencyMiddleware, store=store, policy=IdempotencyPolicy(scope=account_of))

In atomic mode the handler finds the record's AsyncConnection in `request.state.idem_connection` (the ASGI scope's
"state"), through `idem_dialects.http.current_connection()`, or with the FastAPI dependency `IdemConnection`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..aio import AsyncIdempotencyStore
from .core import HttpRequest, IdempotencyPolicy, ResponseTooLarge, claimed_outside
from .problems import HttpResponse
from .runner import AsyncIdempotency

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
STATE_KEY = "idem_connection"


def decode_headers(raw: Any) -> list[tuple[str, str]]:
    return [(bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1")) for k, v in raw]


class Disconnected(Exception):
    """The client went away before its request body was complete: nothing to claim, nothing to answer."""


async def read_body(receive: Receive, limit: int) -> tuple[bytes, bool]:
    """The request body, or (b"", True) once it is over `limit` (the request is then refused)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Disconnected
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > limit:
            return b"", True
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False


async def run_asgi(app: ASGIApp, scope: Scope, receive: Receive, body: bytes, conn: Any, limit: int
                   ) -> HttpResponse:
    """Call `app` with the buffered body and collect its whole response (ResponseTooLarge past `limit`)."""
    inner = dict(scope)
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
    chunks: list[bytes] = []
    size = 0

    async def capture(message: Message) -> None:
        nonlocal size
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunk = bytes(message.get("body", b""))
            size += len(chunk)
            if size > limit:
                raise ResponseTooLarge(size)
            chunks.append(chunk)

    await app(inner, replay_receive, capture)
    if not start:
        raise RuntimeError("the ASGI application returned without starting a response")
    return HttpResponse(int(start["status"]), decode_headers(start.get("headers", [])), b"".join(chunks))


async def send_response(resp: HttpResponse, send: Send) -> None:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers]
    if resp.header("content-length") is None:
        headers.append((b"content-length", str(len(resp.body)).encode("ascii")))
    await send({"type": "http.response.start", "status": resp.status, "headers": headers})
    await send({"type": "http.response.body", "body": resp.body, "more_body": False})


class IdempotencyMiddleware:
    """Wrap an ASGI app: requests the policy selects are claimed, run once, stored and replayed."""

    def __init__(self, app: ASGIApp, store: AsyncIdempotencyStore, policy: IdempotencyPolicy) -> None:
        self.app = app
        self.policy = policy
        self.idempotency = AsyncIdempotency(store, policy)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        policy = self.policy
        if scope["type"] != "http" or not policy.applies(scope["method"], scope["path"]):
            return await self.app(scope, receive, send)
        if claimed_outside(scope, self.idempotency.identity):
            return await self.app(scope, receive, send)  # an outer layer on this store claimed it
        headers = decode_headers(scope.get("headers", []))
        if not policy.require_key and all(k != policy.header.lower() for k, _ in headers):
            return await self.app(scope, receive, send)
        declared = next((v for k, v in headers if k == "content-length"), "0")
        too_large = declared.isdigit() and int(declared) > policy.max_request_bytes
        try:
            body, over = (b"", True) if too_large else await read_body(receive, policy.max_request_bytes)
        except Disconnected:
            return None
        req = HttpRequest(method=scope["method"], path=scope["path"], headers=headers, native=scope, body=body,
                          body_too_large=over, query=bytes(scope.get("query_string", b"")).decode("latin-1"),
                          context=scope)

        async def handler(conn: Any) -> HttpResponse:
            return await run_asgi(self.app, scope, receive, body, conn, policy.max_response_bytes)

        await send_response(await self.idempotency.handle(req, handler), send)
