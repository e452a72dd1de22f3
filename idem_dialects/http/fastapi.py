"""FastAPI forms on the async store (imports FastAPI; install the [http] extra).

- `IdemConnection`: a dependency giving the handler the record's AsyncConnection (atomic mode), so the business
  write and the idempotency record commit together. Works under the ASGI middleware and under `idempotent_route`.
- `idempotent_route(store, policy)`: an `APIRoute` class making only the routes of one router idempotent:
  `APIRouter(route_class=idempotent_route(store, policy))`. An `HTTPException` raised by such an endpoint rolls back
  and is answered by FastAPI as usual, unstored (under the middleware, FastAPI has already turned it into a 4xx
  response, which is stored).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute

from ..aio import AsyncIdempotencyStore
from .asgi import STATE_KEY, decode_headers
from .core import HttpRequest, IdempotencyPolicy, ResponseTooLarge, current_connection
from .problems import HttpResponse
from .runner import AsyncIdempotency


def idem_connection(request: Request) -> Any:
    """The idempotency record's transaction connection for this request (atomic mode)."""
    conn = getattr(request.state, STATE_KEY, None)
    return conn if conn is not None else current_connection()


IdemConnection = Annotated[Any, Depends(idem_connection)]


async def _buffer(resp: Response, limit: int) -> bytes:
    body = getattr(resp, "body", None)
    if isinstance(body, bytes):
        if len(body) > limit:
            raise ResponseTooLarge(len(body))
        return body
    chunks: list[bytes] = []  # a StreamingResponse: buffered up to the limit, since the record needs all of it
    size = 0
    async for chunk in resp.body_iterator:  # type: ignore[attr-defined]
        data = chunk if isinstance(chunk, bytes) else str(chunk).encode(getattr(resp, "charset", "utf-8"))
        size += len(data)
        if size > limit:
            raise ResponseTooLarge(size)
        chunks.append(data)
    return b"".join(chunks)


def idempotent_route(store: AsyncIdempotencyStore, policy: IdempotencyPolicy) -> type[APIRoute]:
    """A route class whose endpoints run under `policy` (methods outside `policy.methods` pass through)."""
    idempotency = AsyncIdempotency(store, policy)

    class IdempotentRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            original = super().get_route_handler()

            async def handle(request: Request) -> Response:
                headers = decode_headers(request.scope.get("headers", []))
                has_key = any(k == policy.header.lower() for k, _ in headers)
                if not policy.applies(request.method, request.url.path) or (not policy.require_key and not has_key):
                    return await original(request)
                declared = request.headers.get("content-length", "0")
                too_large = declared.isdigit() and int(declared) > policy.max_request_bytes
                req = HttpRequest(method=request.method, path=request.url.path, headers=headers, native=request,
                                  body=b"" if too_large else await request.body(), body_too_large=too_large,
                                  query=request.url.query)

                async def handler(conn: Any) -> HttpResponse:
                    if conn is not None:
                        setattr(request.state, STATE_KEY, conn)
                    resp = await original(request)
                    body = await _buffer(resp, policy.max_response_bytes)
                    return HttpResponse(resp.status_code, decode_headers(resp.raw_headers), body)

                out = await idempotency.handle(req, handler)
                response = Response(out.body, status_code=out.status)
                raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in out.headers]
                if out.header("content-length") is None:
                    raw.append((b"content-length", str(len(out.body)).encode("ascii")))
                response.raw_headers = raw
                return response

            return handle

    return IdempotentRoute
