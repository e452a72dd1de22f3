"""FastAPI forms on the async store (imports FastAPI; install the [http] extra).

- `IdemConnection`: a dependency giving the handler the record's AsyncConnection (atomic mode), so the business
  write and the idempotency record commit together. Works under the ASGI middleware and under `idempotent_route`.
- `idempotent_route(store, policy)`: an `APIRoute` class making only the routes of one router idempotent:
  `APIRouter(route_class=idempotent_route(store, policy))`. An `HTTPException` raised by such an endpoint rolls back
  and is answered by FastAPI as usual, unstored; so is a request-validation 422 (the endpoint never ran: the
  corrected request may use the same key). The route's OpenAPI operation documents the `Idempotency-Key` header
  (required or optional, as the policy says) and the 400/409/422 problem responses.
  Under the ASGI middleware on the same store, the route class passes the request through (the middleware holds the
  claim) and tells it whether the endpoint ran, so the middleware stores the endpoint's answers only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Sequence
from typing import Annotated, Any

from fastapi import Depends, Header, Request, Response
from fastapi.params import Depends as DependsParam
from fastapi.routing import APIRoute

from ..aio import AsyncIdempotencyStore
from .asgi import STATE_KEY, decode_headers
from .core import HttpRequest, IdempotencyPolicy, ResponseTooLarge, claimed_outside, current_connection, routed
from .problems import PROBLEM_TYPE, HttpResponse
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


_PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"type": {"type": "string", "format": "uri"}, "title": {"type": "string"},
                   "status": {"type": "integer"}, "detail": {"type": "string"}},
    "required": ["type", "title", "status"],
}


def problem_responses(policy: IdempotencyPolicy) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI responses the idempotency layer may answer on a route, as RFC 9457 problems."""
    def answer(description: str) -> dict[str, Any]:
        return {"description": description, "content": {PROBLEM_TYPE: {"schema": _PROBLEM_SCHEMA}}}

    return {
        400: answer(f"The {policy.header} header is missing or malformed (problem+json)."),
        409: answer(f"A request with this {policy.header} is still in progress: retry after Retry-After seconds."),
        422: answer(f"This {policy.header} was first used with a different request (problem+json), or the request"
                    " failed validation."),
    }


def key_parameter(policy: IdempotencyPolicy) -> Callable[..., None]:
    """A dependency declaring the key header in the OpenAPI schema. The idempotency layer reads and checks the
    header before FastAPI does (a missing or bad key is its 400 problem), so this only documents it."""
    description = (f"A key chosen once per intent (e.g. a UUID), quoted or bare: {policy.header}: \"8e03978e-...\"."
                   " At most 255 characters. A retry with the same key and request gets the stored response.")
    header = Header(alias=policy.header, description=description)
    if policy.require_key:
        parameter = inspect.Parameter("idempotency_key", inspect.Parameter.KEYWORD_ONLY,
                                      annotation=Annotated[str, header])
    else:
        parameter = inspect.Parameter("idempotency_key", inspect.Parameter.KEYWORD_ONLY, default=None,
                                      annotation=Annotated[str | None, header])

    def idempotency_key(**_: Any) -> None:
        return None

    idempotency_key.__signature__ = inspect.Signature([parameter])  # type: ignore[attr-defined]
    return idempotency_key


def idempotent_route(store: AsyncIdempotencyStore, policy: IdempotencyPolicy) -> type[APIRoute]:
    """A route class whose endpoints run under `policy` (methods outside `policy.methods` pass through)."""
    idempotency = AsyncIdempotency(store, policy)
    documented = key_parameter(policy)

    class IdempotentRoute(APIRoute):
        def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
            methods = kwargs.get("methods") or ["GET"]
            if any(policy.applies(m, path) for m in methods):  # document the header and the layer's answers
                dependencies: Sequence[DependsParam] = kwargs.get("dependencies") or []
                kwargs["dependencies"] = [*dependencies, Depends(documented)]
                kwargs["responses"] = {**problem_responses(policy), **(kwargs.get("responses") or {})}
            super().__init__(path, endpoint, **kwargs)

        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            original = super().get_route_handler()

            async def handle(request: Request) -> Response:
                headers = decode_headers(request.scope.get("headers", []))
                has_key = any(k == policy.header.lower() for k, _ in headers)
                if not policy.applies(request.method, request.url.path) or (not policy.require_key and not has_key):
                    return await original(request)
                marks = routed(request.scope)  # outer layers learn the route received it ...
                if claimed_outside(request.scope, idempotency.identity):  # the ASGI middleware holds the claim
                    passed = await original(request)
                    if marks is not None:
                        marks.began = True  # ... and that the endpoint answered (not validation or an exception)
                    return passed
                declared = request.headers.get("content-length", "0")
                too_large = declared.isdigit() and int(declared) > policy.max_request_bytes
                req = HttpRequest(method=request.method, path=request.url.path, headers=headers, native=request,
                                  body=b"" if too_large else await request.body(), body_too_large=too_large,
                                  query=request.url.query, context=request.scope, route=True)

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
