"""What an HTTP layer is configured with, and what it sees of a request: `IdempotencyPolicy` and `HttpRequest`
(`core` says what they mean for storing and replaying)."""

from __future__ import annotations

from collections.abc import Callable, Collection, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..errors import ConfigurationError
from ..limits import ON_IN_FLIGHT, OnInFlight
from .problems import PROBLEM_BASE, HttpResponse, problem

DEFAULT_REPLAY_HEADERS = ("content-type", "content-language", "content-location", "location", "etag",
                          "last-modified", "link")
# Headers that say how to read the stored bytes: kept whatever `replay_headers` allows.
BODY_HEADERS = frozenset({"content-encoding"})


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """A request as the core sees it: headers are (lower-case name, value) pairs; `native` is the framework's
    own request (ASGI scope, WSGI environ, flask.Request, starlette Request) for the scope callable."""

    method: str
    path: str
    headers: list[tuple[str, str]]
    native: Any = None
    body: bytes = b""
    query: str = ""  # the raw query string, part of the fingerprinted target
    body_too_large: bool = False  # the adapter saw a Content-Length over the limit and did not read the body
    # The ASGI scope / WSGI environ, shared by the layers on this request: where they leave their `Passage`.
    context: MutableMapping[str, Any] | None = None
    # The adapter's handler is the route's own handler (a route class, a view decorator): what it answers, the
    # handler made; False for middleware, which cannot tell a framework's own answers from the handler's.
    route: bool = False

    def header_values(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k == name]

    def header(self, name: str) -> str | None:
        values = self.header_values(name)
        return ", ".join(values) if values else None


# Answers that mean "not done, try again": never a result a retry should get back.
RETRYABLE_STATUSES = frozenset({408, 425, 429})
# Answers a framework gives before any handler runs: a redirect (FastAPI's redirect_slashes 307, Flask's 308), a
# malformed request (Django's 400) or request validation (FastAPI's 422, Litestar's 400), no route (404), wrong
# method (405).
FRAMEWORK_STATUSES = frozenset({400, 404, 405, 422})


def default_store_status(status: int) -> bool:
    """Store 2xx, 3xx and 4xx (a 303 after a POST is a result too), except 408, 425 and 429; never a 5xx."""
    return 200 <= status < 500 and status not in RETRYABLE_STATUSES


def default_framework_status(status: int) -> bool:
    """The statuses a framework answers on its own (3xx, 400, 404, 405, 422): under plain middleware, not stored."""
    return 300 <= status < 400 or status in FRAMEWORK_STATUSES


@dataclass(frozen=True)
class IdempotencyPolicy:
    """How requests take part. `scope` (who owns the key, from authentication) is required unless `global_scope`.

    `lease` set: external-call mode (claim committed first under that lease, handler outside any transaction, then
    complete; the lease is renewed while the handler runs). None: atomic mode (claim, handler and record in one
    transaction; the handler gets its connection).

    `on_in_flight`, atomic mode: what a request does while another with its key is still being handled (its claim
    not committed): "wait" (default) for it, then replay its response; "conflict": answer 409 `request-in-flight` with
    Retry-After at once (the store's `run(on_in_flight=...)`). External-call mode always answers 409."""

    scope: Callable[[HttpRequest], object] | None = None
    global_scope: bool = False
    operation: str | Callable[[HttpRequest], str] = "http"
    header: str = "Idempotency-Key"
    allow_token: bool = True  # False: the draft's strict syntax, a quoted Structured Field string only
    methods: Collection[str] = ("POST", "PATCH")
    paths: Callable[[str], bool] | Collection[str] | None = None
    require_key: bool = True
    fingerprint_method: bool = True
    fingerprint_path: bool = True
    fingerprint_headers: Collection[str] = ()
    replay_headers: Collection[str] = DEFAULT_REPLAY_HEADERS
    store_status: Callable[[int], bool] = default_store_status
    framework_status: Callable[[int], bool] = default_framework_status
    replay_marker: tuple[str, str] = ("Idempotent-Replayed", "true")
    problem_base: str = PROBLEM_BASE
    max_request_bytes: int = 1 << 20
    max_response_bytes: int = 1 << 20
    lease: timedelta | None = None
    on_in_flight: OnInFlight = "wait"
    _methods: frozenset[str] = field(init=False, repr=False)
    _replay: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.scope is None and not self.global_scope:
            raise ConfigurationError(
                "IdempotencyPolicy needs scope=callable(request) -> owner id (e.g. the authenticated account), so"
                " one client's key never replays another's response; pass global_scope=True only if keys are"
                " unique across all clients")
        if self.scope is not None and self.global_scope:
            raise ConfigurationError("IdempotencyPolicy: give scope= or global_scope=True, not both")
        if self.lease is not None and (not isinstance(self.lease, timedelta) or self.lease <= timedelta(0)):
            raise ConfigurationError(f"IdempotencyPolicy: lease must be a positive timedelta, got {self.lease!r}")
        if self.on_in_flight not in ON_IN_FLIGHT:
            raise ConfigurationError(f"IdempotencyPolicy: on_in_flight must be 'wait' or 'conflict', got"
                                     f" {self.on_in_flight!r}")
        object.__setattr__(self, "_methods", frozenset(m.upper() for m in self.methods))
        object.__setattr__(self, "_replay", frozenset(h.lower() for h in self.replay_headers))

    def takes_part(self, method: str, path: str, has_key: bool) -> bool:
        """Whether a request is the layer's at all (every integration asks this first; anything else passes through
        untouched): its method and path are the policy's, and it has a key unless one is required (a keyless
        request is then answered 400 missing-key)."""
        return self.applies(method, path) and (has_key or self.require_key)

    def applies(self, method: str, path: str) -> bool:
        """Whether a request with this method and path takes part (decided before its body is read)."""
        if method.upper() not in self._methods:
            return False
        if self.paths is None:
            return True
        if callable(self.paths):
            return bool(self.paths(path))
        return path in self.paths

    def problem(self, slug: str, status: int, detail: str, retry_after: float | None = None) -> HttpResponse:
        return problem(slug, status, detail, base=self.problem_base, retry_after=retry_after)
