"""The Django adapter of the HTTP layer: a middleware and a view decorator that run the one request flow
(`idem_dialects.http.exchange`) on a `DjangoStore`. They only translate: a Django (or DRF) request into the core's
`HttpRequest`, and the view's response into the core's `HttpResponse` and back.

Both take part only in the requests the policy selects (the middleware: its methods and paths; the decorator: its
methods; a keyless one only if keys are required), and both treat an HTTP exception the view raises (`Http404`,
`PermissionDenied`, `BadRequest`, `SuspiciousOperation`, DRF's `APIException`) as the view's answer: the middleware
gets Django's response for it, and the decorator makes the same one (DRF's, on a DRF view). Its writes roll back, and
the answer is stored by its status in a transaction of its own."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.core.exceptions import BadRequest, ImproperlyConfigured, PermissionDenied, SuspiciousOperation
from django.core.handlers.exception import response_for_exception
from django.db import connections
from django.http import Http404, HttpResponseBase
from django.http import HttpRequest as DjangoRequest
from django.http import HttpResponse as DjangoResponse
from sqlalchemy.engine import Connection

from ..http.bodies import Buffer, is_event_stream, response_body, streamed
from ..http.core import Raised, note_raised, raised_in
from ..http.policy import HttpRequest, IdempotencyPolicy
from ..http.problems import HttpResponse
from ..http.runner import Idempotency
from ..sharding.sync import ShardedStore
from .conf import Config, Scope, get_config, get_store
from .connection import DjangoStore

View = TypeVar("View", bound=Callable[..., Any])


def http_request(request: Any, max_bytes: int, route: bool = False) -> HttpRequest:
    """The core's view of a Django request (or of the Django request inside a DRF `Request`); the body is read
    unless its Content-Length is over `max_bytes`. `native` is the request as the view gets it, for the scope."""
    django: DjangoRequest = getattr(request, "_request", request)
    meta = django.META
    try:
        length = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    too_large = length > max_bytes
    return HttpRequest(method=str(django.method).upper(), path=django.path,
                       headers=[(k.lower(), str(v)) for k, v in django.headers.items()], native=request,
                       body=b"" if too_large else django.body, query=str(meta.get("QUERY_STRING", "")),
                       body_too_large=too_large, context=meta, route=route)


def core_response(response: HttpResponseBase, limit: int, request: HttpRequest) -> HttpResponse:
    """The view's response, complete (a streaming one is buffered and handed on as one chunk); BodyOverLimit past
    `limit` bytes, since the record must hold all of it. Server-sent events are passed on as they stream, not stored
    (`core.streamed`)."""
    headers = list(response.items())
    if response.streaming and is_event_stream(headers):
        return streamed(request.method, request.path, response.status_code, [])
    if response.streaming:
        buffer = Buffer(limit)
        for chunk in response.streaming_content:  # type: ignore[attr-defined]
            buffer.keep(chunk)
        body = buffer.body()
        response.streaming_content = [body]  # type: ignore[attr-defined]
    else:
        body = response_body(response.content, limit)  # type: ignore[attr-defined]
    return HttpResponse(response.status_code, headers, body)


def django_response(answer: HttpResponse) -> DjangoResponse:
    """A replay or a problem as a Django response: its status, headers and body bytes exactly."""
    out = DjangoResponse(answer.body, status=answer.status)
    del out["Content-Type"]  # Django's default; the stored headers say what the original had
    joined: dict[str, list[str]] = {}
    for name, value in answer.headers:
        joined.setdefault(name, []).append(value)
    for name, values in joined.items():  # repeated lines (Link) as one, which HTTP allows
        out[name] = ", ".join(values)
    return out


def respond(store: DjangoStore | ShardedStore, policy: IdempotencyPolicy, request: Any,
            view: Callable[[], HttpResponseBase], route: bool = False) -> HttpResponseBase:
    """Answer `request` under `policy`: the view's own response (run at most once per key, in atomic mode inside the
    record's transaction), a replay, or a problem. The view's exceptions propagate unchanged."""
    aliases = [store.using] if isinstance(store, DjangoStore) else list(store.shards)
    held = [alias for alias in aliases if connections[alias].in_atomic_block]
    if policy.lease is not None and held:
        raise ImproperlyConfigured(
            "external-call (lease) mode commits the claim before the view runs, which cannot happen inside an atomic"
            f" block on {held[0]!r}: turn ATOMIC_REQUESTS off for this view (@transaction.non_atomic_requests)")
    ran: list[tuple[HttpResponseBase, HttpResponse]] = []
    meta = getattr(request, "_request", request).META

    req = http_request(request, policy.max_request_bytes, route)

    def handler(conn: Connection | None) -> HttpResponse:
        response = view()
        ran[:] = [(response, core_response(response, policy.max_response_bytes, req))]
        if raised_in(meta) or getattr(response, "exception", False):  # DRF marks the answer to an exception
            raise Raised(ran[0][1])  # its writes roll back; the answer is stored on its own
        return ran[0][1]

    # route: the decorator wraps the view itself, so what it answers is the view's own (the middleware cannot tell
    # Django's 404/405/redirects from the view's; see idem_dialects.http.core).
    answer = Idempotency(store, policy).handle(req, handler)
    if ran and answer is ran[0][1]:
        return ran[0][0]  # the view's response object itself: cookies, streaming and all
    return django_response(answer)


def answered(exc: Exception, request: Any, view_self: Any) -> Any:
    """The response for an HTTP exception the view raised, as the framework would make it (DRF's view handles its
    own and Django's; Django's `response_for_exception` the others); None for any other exception."""
    view = _drf_view(request, view_self)
    if view is not None and isinstance(exc, (Http404, PermissionDenied, *_drf_exceptions())):
        return view.handle_exception(exc)
    if isinstance(exc, (Http404, PermissionDenied, BadRequest, SuspiciousOperation)):
        return response_for_exception(getattr(request, "_request", request), exc)
    return None


def _drf_view(request: Any, view_self: Any) -> Any:
    if hasattr(view_self, "handle_exception"):
        return view_self
    return (getattr(request, "parser_context", None) or {}).get("view")  # @api_view's view


def _drf_exceptions() -> tuple[type[Exception], ...]:
    try:
        from rest_framework.exceptions import APIException  # type: ignore[import-untyped]
    except ImportError:  # DRF is optional
        return ()
    return (APIException,)


def finished(response: Any, request: Any, view_self: Any, args: Iterable[Any], kwargs: dict[str, Any]) -> Any:
    """A response as Django would send it: a DRF `Response` a view method returned is finalized by its view (content
    negotiation, as `APIView.dispatch` does next) and rendered, a TemplateResponse rendered."""
    if getattr(response, "is_rendered", True):
        return response
    if hasattr(response, "data") and getattr(response, "accepted_renderer", None) is None:
        view = view_self if hasattr(view_self, "finalize_response") else \
            getattr(request, "parser_context", {}).get("view")
        if view is None:
            raise ImproperlyConfigured("@idempotent got a DRF Response it cannot render: put it on the APIView's"
                                       " method (or inside @api_view)")
        response = view.finalize_response(request, response, *args, **kwargs)
    return response.render()


class IdempotencyMiddleware:
    """Runs the requests ``settings.IDEMPOTENCY['POLICY']`` selects once per key. Place it after
    ``AuthenticationMiddleware`` (the default scope is ``request.user``)."""

    def __init__(self, get_response: Callable[[DjangoRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        get_config()  # a configuration problem shows at start-up

    def __call__(self, request: DjangoRequest) -> HttpResponseBase:
        policy = _policy(get_config(), None, _NO_OVERRIDES)
        if not takes_part(policy, request):
            return self.get_response(request)
        return respond(get_store(), policy, request, lambda: self.get_response(request))

    def process_exception(self, request: DjangoRequest, exception: Exception) -> None:
        """The view raised: whatever answers it (Django's response for an HTTP exception, another middleware's),
        its writes roll back (see `respond`)."""
        note_raised(request.META)


def takes_part(policy: IdempotencyPolicy, request: Any) -> bool:
    """Whether the policy selects a Django (or DRF) request; the others go to the view untouched."""
    django: DjangoRequest = getattr(request, "_request", request)
    return policy.takes_part(str(django.method), django.path, policy.header in django.headers)


def idempotent(*, using: str | None = None, scope: Scope | str | None = None, **policy: Any) -> Callable[[View], View]:
    """A view decorator: function views, a class-based view's ``as_view()`` or its methods (``method_decorator``),
    DRF ``APIView``/viewset methods and ``@api_view`` functions (below ``@api_view``, so DRF's authentication
    has set ``request.user``). `using`, `scope` and IdempotencyPolicy options override ``settings.IDEMPOTENCY``.
    POLICY's ``methods`` apply, its ``paths`` do not: they select the requests the middleware takes, and a view
    decorated is idempotent wherever it is routed."""

    overrides = {"paths": None, **policy}  # explicit decoration wins: POLICY's paths select for the middleware

    def decorate(view: View) -> View:
        if inspect.iscoroutinefunction(view):
            raise ImproperlyConfigured(f"@idempotent decorates sync views; {view.__qualname__} is async (use a sync"
                                       " view, or IdempotencyMiddleware, which Django runs around async views too)")

        @functools.wraps(view)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            view_self, request, rest = _split(args)
            chosen = _policy(get_config(), scope, overrides)
            if not takes_part(chosen, request):
                return view(*args, **kwargs)

            def call() -> HttpResponseBase:
                try:
                    response = view(*args, **kwargs)
                except Exception as exc:
                    response = answered(exc, request, view_self)
                    if response is None:
                        raise  # the view's own error, unchanged
                    note_raised(getattr(request, "_request", request).META)
                return finished(response, request, view_self, rest, kwargs)  # type: ignore[no-any-return]

            return respond(get_store(using), chosen, request, call, route=True)

        return wrapped  # type: ignore[return-value]

    return decorate


_NO_OVERRIDES: dict[str, Any] = {}
_policies: dict[tuple[int, int], tuple[Config, IdempotencyPolicy]] = {}


def _policy(config: Config, scope: Scope | str | None, overrides: dict[str, Any]) -> IdempotencyPolicy:
    """The policy of `config` with a decorator's overrides, built once per configuration (settings may change)."""
    key = (id(config), id(overrides))
    cached = _policies.get(key)
    if cached is None or cached[0] is not config:
        cached = _policies[key] = (config, config.make_policy(scope, **overrides))
    return cached[1]


def _split(args: tuple[Any, ...]) -> tuple[Any, Any, tuple[Any, ...]]:
    """(the view instance or None, the request, the view's other positional arguments)."""
    if args and hasattr(args[0], "META"):
        return None, args[0], args[1:]
    if len(args) > 1 and hasattr(args[1], "META"):
        return args[0], args[1], args[2:]
    raise ImproperlyConfigured("@idempotent decorates a view: its first argument (after self) must be the request")
