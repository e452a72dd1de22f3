"""FastAPI forms on the async store (imports FastAPI; install the [fastapi] extra, and an async driver).

- `IdemConnection`: a dependency giving the handler the record's AsyncConnection (atomic mode), so the business
  write and the idempotency record commit together; None where there is no record transaction (external-call mode,
  a request the layer passes through). Works under the ASGI middleware and under `idempotent_route`.
- `idempotent_route(store, policy)`: an `APIRoute` class making only the routes of one router idempotent:
  `APIRouter(route_class=idempotent_route(store, policy))`. An `HTTPException` raised by such an endpoint (or its
  dependencies) is its answer, as under the ASGI middleware: its writes roll back, and the app's handler for it makes
  the response, stored by its status in a transaction of its own (see `idem_dialects.http.core`). A
  request-validation 422 is not stored (the endpoint never ran: the corrected request may use the same key). The
  route's OpenAPI operation documents the `Idempotency-Key` header (required or optional, as the policy says) and
  the 400/409/422 problem responses.
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
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ..api import AsyncStoreAPI
from .asgi import STATE_KEY, captured, decode_headers, has_key
from .bodies import Buffer, declared_too_large, is_event_stream, response_body, streamed
from .core import Admission, Raised, current_connection, entry, note_raised, raised_in, routed, wire_headers
from .policy import HttpRequest, IdempotencyPolicy
from .problems import PROBLEM_TYPE, HttpResponse
from .runner import AsyncIdempotency

__all__ = ["IdemConnection", "idem_connection", "idempotent_route"]  # public: the API reference documents each


async def idem_connection(request: Request) -> Any:
    """The idempotency record's transaction connection for this request (atomic mode), else None. An `async def`, so
    FastAPI calls it on the event loop: a plain `def` dependency is run in its thread pool, a hop per request."""
    conn = getattr(request.state, STATE_KEY, None)
    return conn if conn is not None else current_connection(required=False)


async def answered(request: Request, exc: HTTPException) -> Response:
    """The response the app gives for an `HTTPException` (its handler for the status or the class, as Starlette's
    exception middleware picks it); the exception itself if the app has none."""
    found: tuple[dict[Any, Any], dict[int, Any]] = request.scope.get("starlette.exception_handlers") or ({}, {})
    handlers, by_status = found
    handler = by_status.get(exc.status_code) or next(
        (handlers[cls] for cls in type(exc).__mro__ if cls in handlers), None)
    if handler is None:
        raise exc
    if inspect.iscoroutinefunction(handler):
        response = await handler(request, exc)
    else:
        response = await run_in_threadpool(handler, request, exc)
    if not isinstance(response, Response):
        raise exc
    return response


IdemConnection = Annotated[Any, Depends(idem_connection)]
"""Annotate an endpoint's parameter with it (``conn: IdemConnection``) to get the record's AsyncConnection."""


async def _buffer(resp: Response, limit: int) -> bytes:
    body = getattr(resp, "body", None)
    if isinstance(body, bytes):
        return response_body(body, limit)
    buffer = Buffer(limit)  # a StreamingResponse: buffered up to the limit, since the record needs all of it
    async for chunk in resp.body_iterator:  # type: ignore[attr-defined]
        buffer.keep(chunk if isinstance(chunk, bytes) else str(chunk).encode(getattr(resp, "charset", "utf-8")))
    return buffer.body()


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


def key_parameter(policy: IdempotencyPolicy) -> Callable[..., Coroutine[Any, Any, None]]:
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

    async def idempotency_key(**_: Any) -> None:  # async: FastAPI runs a plain `def` in its thread pool
        return None

    idempotency_key.__signature__ = inspect.Signature([parameter])  # type: ignore[attr-defined]
    return idempotency_key


def idempotent_route(store: AsyncStoreAPI[Any], policy: IdempotencyPolicy) -> type[APIRoute]:
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

            async def endpoint(request: Request) -> Response:
                """The endpoint's answer, a raised HTTPException's included (validation errors propagate)."""
                try:
                    return await original(request)
                except HTTPException as exc:
                    note_raised(request.scope)
                    return await answered(request, exc)

            async def handle(request: Request) -> Response:
                headers = decode_headers(request.scope.get("headers", []))
                met = entry(policy, idempotency.identity, request.method, request.url.path, has_key(policy, headers),
                            request.scope)
                if met is Admission.PASS:
                    return await original(request)
                marks = routed(request.scope)  # outer layers learn the route received it ...
                if met is Admission.OUTSIDE:  # the ASGI middleware holds the claim
                    passed = await endpoint(request)
                    if marks is not None:
                        marks.began = True  # ... and that the endpoint answered (not validation or an exception)
                    return passed
                too_large = declared_too_large(policy, request.headers.get("content-length"))
                req = HttpRequest(method=request.method, path=request.url.path, headers=headers, native=request,
                                  body=b"" if too_large else await request.body(), body_too_large=too_large,
                                  query=request.url.query, context=request.scope, route=True)

                streams: list[Response] = []

                async def handler(conn: Any) -> HttpResponse:
                    if conn is not None:
                        setattr(request.state, STATE_KEY, conn)
                    resp = await endpoint(request)
                    if is_event_stream(decode_headers(resp.raw_headers)):  # passed on as it streams, not stored
                        streams.append(resp)
                        return streamed(request.method, request.url.path, resp.status_code, [])
                    out = captured(resp.status_code, resp.raw_headers, await _buffer(resp, policy.max_response_bytes))
                    if raised_in(request.scope):
                        raise Raised(out)  # its writes roll back; the answer is stored on its own
                    return out

                out = await idempotency.handle(req, handler)
                if out.streamed:
                    return streams[0]
                response = Response(out.body, status_code=out.status)
                response.raw_headers = wire_headers(out)  # the endpoint's own head, a replay's or a problem's
                return response

            return handle

    return IdempotentRoute
