"""The HTTP-neutral part: which requests take part, what identifies them, what is stored and how it is replayed.

The adapters (WSGI, ASGI, Flask, FastAPI) turn their native request into an `HttpRequest`, ask `prepare` what to do,
and run the handler through a sync or async driver; everything about HTTP semantics lives here, once.

**Fingerprint.** The store compares a request's fingerprint, SHA-256 over the RFC 8785 canonical JSON of:

    {"method": "POST", "path": "/payments?a=1", "headers": {"<name>": "<value>"}, "body": {"<kind>": "<sha256 hex>"}}

where `body` is `{"json": sha256(JCS(parsed body))}` when the content type is JSON (`application/json`, `*+json`) and
the body parses and canonicalizes (so key order and whitespace do not matter), else `{"bytes": sha256(raw body)}`;
`path` carries the query string when there is one; `headers` holds only the policy's `fingerprint_headers`
(lower-cased; repeated lines joined with ", "). Leave out the method or path (and query) with
`fingerprint_method=False` / `fingerprint_path=False`.

**Stored and replayed.** Status, body bytes exactly, and the headers in `replay_headers` (an allow-list; default
Content-Type, Content-Language, Content-Location, Location, ETag, Last-Modified, Link). Only what a retry should see
is stored: a response the handler made, whose status `store_status(status)` accepts (default 2xx-4xx except 408, 425
and 429; never a 5xx). Any other is answered as is and leaves no record: the transaction rolls back in atomic mode,
the claim is released in external-call mode. Whether the handler made it: the route integrations (FastAPI route
class, Flask decorator, Django decorator) know; under plain middleware, a status `framework_status(status)` accepts
(default 3xx, 404, 405, 422: redirects, no route, wrong method, request validation, which a framework answers before
any handler runs) is taken as the framework's and not stored. A replay carries the marker header
(`Idempotent-Replayed: true` by default).

**Layers on one request** (`Passage`, in the ASGI scope / WSGI environ): a layer that claims a request notes its
store there; a layer further in on the same store passes the request through instead of claiming it again (which
would wait on the outer layer's own claim), and a route integration notes that the handler ran.

**Limits.** A request body over `max_request_bytes` is refused (413 problem) before any claim. A response, streamed
or not, is buffered until it is complete (the record must hold all of it before the first byte leaves); one over
`max_response_bytes` is refused with a 500 `response-too-large` problem. In atomic mode the transaction rolls back
(the handler's writes with it), so a retry runs the handler again; in external-call mode the handler has acted, so the
claim is completed with that problem, which every retry receives instead of a second run. Routes that stream
(server-sent events, large downloads) should not be idempotency routes: leave them out with `paths` / `methods`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import rfc8785

from ..errors import ConfigurationError, IdemError
from ..limits import ON_IN_FLIGHT, OnInFlight
from ..outcomes import Claimed, InFlight, Mismatch, Outcome, Replayed
from .keyheader import KeyHeaderError, parse_key_header
from .problems import PROBLEM_BASE, HttpResponse, error_problem, problem

DEFAULT_REPLAY_HEADERS = ("content-type", "content-language", "content-location", "location", "etag",
                          "last-modified", "link")


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
# Answers a framework gives before any handler runs: a redirect (FastAPI's redirect_slashes 307, Flask's 308), no
# route (404), wrong method (405), request validation (FastAPI's 422).
FRAMEWORK_STATUSES = frozenset({404, 405, 422})


def default_store_status(status: int) -> bool:
    """Store 2xx, 3xx and 4xx (a 303 after a POST is a result too), except 408, 425 and 429; never a 5xx."""
    return 200 <= status < 500 and status not in RETRYABLE_STATUSES


def default_framework_status(status: int) -> bool:
    """The statuses a framework answers on its own (3xx, 404, 405, 422): under plain middleware, not stored."""
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


PASSAGE_KEY = "idem_dialects.passage"


@dataclass
class Passage:
    """What the idempotency layers on one request tell each other (kept in its ASGI scope / WSGI environ, which
    adapters copy shallowly, so every layer sees the same object)."""

    claimed: set[str] = field(default_factory=set)  # stores (`store_identity`) holding this request's claim
    routed: bool = False  # a route integration received the request
    began: bool = False  # ... and its handler produced the response


def passage(context: MutableMapping[str, Any] | None) -> Passage | None:
    if context is None:
        return None
    found = context.get(PASSAGE_KEY)
    if not isinstance(found, Passage):
        found = context[PASSAGE_KEY] = Passage()
    return found


def store_identity(engine_url: Any, table_prefix: str) -> str:
    """Two store objects on the same database and tables are the same store to a request: one claim between them."""
    return f"{engine_url}|{table_prefix}"


def claimed_outside(context: MutableMapping[str, Any] | None, store: str) -> bool:
    """Whether a layer further out already claimed this request on `store`: then this one passes it through."""
    found = None if context is None else context.get(PASSAGE_KEY)
    return isinstance(found, Passage) and store in found.claimed


def routed(context: MutableMapping[str, Any] | None) -> Passage | None:
    """A route integration marks that it received the request (returns the passage to mark `began` on later)."""
    found = passage(context)
    if found is not None:
        found.routed = True
    return found


def handler_made(policy: IdempotencyPolicy, req: HttpRequest, status: int) -> bool:
    """Whether the response is the handler's own (so `store_status` decides), as far as the layers can tell."""
    if req.route:
        return True
    found = None if req.context is None else req.context.get(PASSAGE_KEY)
    if isinstance(found, Passage) and found.routed:
        return found.began  # a route integration saw the request: it knows
    return not policy.framework_status(status)


def keeps(policy: IdempotencyPolicy, req: HttpRequest, status: int) -> bool:
    """Whether a response is stored for retries: the handler's own, of a status the policy stores."""
    return handler_made(policy, req, status) and policy.store_status(status)


@dataclass(frozen=True, slots=True)
class Call:
    """What the store is asked: the request's identity, ready for `claim`/`run`."""

    scope: str
    operation: str
    key: str
    request: dict[str, Any]


def prepare(policy: IdempotencyPolicy, req: HttpRequest) -> Call | HttpResponse | None:
    """None: pass the request through untouched; a response: answer with it (a problem); a Call: claim it."""
    try:
        key = parse_key_header(req.header_values(policy.header), allow_token=policy.allow_token)
    except KeyHeaderError as exc:
        return policy.problem("invalid-key", 400, f"{policy.header}: {exc.reason}")
    if key is None:
        if not policy.require_key:
            return None
        return policy.problem("missing-key", 400, f"{req.method} {req.path} requires an {policy.header} header"
                              ' (a quoted string chosen once per intent, e.g. "4f1c-...").')
    if req.body_too_large or len(req.body) > policy.max_request_bytes:
        return policy.problem("request-too-large", 413, f"An idempotent request body may hold at most"
                              f" {policy.max_request_bytes} bytes.")
    if policy.global_scope:
        scope: str | None = "global"
    else:
        assert policy.scope is not None
        owner = policy.scope(req)
        scope = None if owner is None or owner == "" else str(owner)  # an int account id is an owner too
    if not scope:
        return policy.problem("unauthenticated", 401, "Idempotent requests must be authenticated: the key belongs"
                              " to the client that sent it.")
    operation = policy.operation if isinstance(policy.operation, str) else policy.operation(req)
    return Call(scope, operation, key, request_identity(policy, req))


def request_identity(policy: IdempotencyPolicy, req: HttpRequest) -> dict[str, Any]:
    """The JSON value the store fingerprints (see the module docstring)."""
    ident: dict[str, Any] = {}
    if policy.fingerprint_method:
        ident["method"] = req.method.upper()
    if policy.fingerprint_path:
        ident["path"] = f"{req.path}?{req.query}" if req.query else req.path
    if policy.fingerprint_headers:
        ident["headers"] = {h.lower(): req.header(h) or "" for h in policy.fingerprint_headers}
    ident["body"] = body_digest(req.header("content-type"), req.body)
    return ident


def body_digest(content_type: str | None, body: bytes) -> dict[str, str]:
    if _is_json(content_type):
        try:
            canonical = rfc8785.dumps(json.loads(body))
        except (ValueError, RecursionError):
            pass  # not JSON after all, or beyond what JCS represents (ints over 2**53, NaN): compare the bytes
        else:
            return {"json": hashlib.sha256(canonical).hexdigest()}
    return {"bytes": hashlib.sha256(body).hexdigest()}


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


# --- what is stored and replayed ---------------------------------------------------------------------------------

def encode_stored(policy: IdempotencyPolicy, resp: HttpResponse) -> bytes:
    """The record's response: one JSON line of allow-listed headers, a newline, then the body bytes untouched."""
    headers = [[k.lower(), v] for k, v in resp.headers if k.lower() in policy._replay]
    return json.dumps(headers, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n" + resp.body


def decode_stored(policy: IdempotencyPolicy, stored: bytes, status: int) -> HttpResponse:
    head, _, body = stored.partition(b"\n")
    headers = [(str(k), str(v)) for k, v in json.loads(head)]
    headers.append(policy.replay_marker)
    return HttpResponse(status, headers, body)


def replay_response(policy: IdempotencyPolicy, call: Call, response: Any, status: int) -> HttpResponse:
    """A stored response as sent again: its status, allow-listed headers and body bytes, plus the marker."""
    if not isinstance(response, bytes):
        raise ConfigurationError(f"the record for key {call.key!r} in {call.scope!r}/{call.operation!r} was not"
                                 " written by the HTTP layer; use another operation name for HTTP routes")
    return decode_stored(policy, response, status)


def outcome_response(policy: IdempotencyPolicy, call: Call, outcome: Outcome) -> HttpResponse | None:
    """The answer for a claim that was not won: a replay, a 422 or a 409; None when the claim is ours."""
    if isinstance(outcome, Claimed):
        return None
    if isinstance(outcome, Replayed):
        return replay_response(policy, call, outcome.response, outcome.status)
    if isinstance(outcome, Mismatch):
        return policy.problem("request-mismatch", 422, "This idempotency key was first used with a different"
                              " request (method, path, body or fingerprinted headers differ). Use a new key for a"
                              " new request.")
    assert isinstance(outcome, InFlight)
    return policy.problem("request-in-flight", 409, "The first request with this idempotency key has not"
                          " finished; retry after the Retry-After delay to get its result.",
                          retry_after=outcome.retry_after)


class NotStored(Exception):
    """Raised out of the effect to roll the atomic transaction back and answer `response` unstored."""

    def __init__(self, response: HttpResponse) -> None:
        self.response = response
        super().__init__(response.status)


class ResponseTooLarge(Exception):
    """An adapter met more response bytes than the policy stores."""


class HandlerErrors:
    """The handler's own exceptions: re-raised unchanged, never turned into problems (even an IdemError of its own)."""

    def __init__(self) -> None:
        self.raised: list[BaseException] = []

    @contextmanager
    def noting(self, conn: Any = None) -> Iterator[None]:
        """Around one call of the handler: its own exceptions are noted, so `answer` re-raises them unchanged; in
        atomic mode `conn`, the record's transaction, is its `current_connection()` meanwhile."""
        token = None if conn is None else _connection.set(conn)
        try:
            yield
        except BaseException as exc:
            if not isinstance(exc, ResponseTooLarge):  # the adapter's, not the handler's
                self.raised.append(exc)
            raise
        finally:
            if token is not None:
                _connection.reset(token)

    def answer(self, policy: IdempotencyPolicy, exc: ResponseTooLarge | IdemError) -> HttpResponse:
        """The problem for an error of the layer or the store; re-raises the handler's own."""
        if any(exc is e for e in self.raised):
            raise exc
        if isinstance(exc, ResponseTooLarge):
            return too_large(policy)
        return error_problem(exc, base=policy.problem_base)


# The connection of the transaction the atomic-mode handler runs in (a sqlalchemy Connection or AsyncConnection).
_connection: ContextVar[Any] = ContextVar("idem_dialects_http_connection", default=None)


def current_connection() -> Any:
    """The idempotency record's transaction connection, for the handler's business writes (atomic mode only)."""
    conn = _connection.get()
    if conn is None:
        raise RuntimeError("no idempotency transaction here: current_connection() works inside a handler run by"
                           " the idempotency middleware/decorator in atomic mode (a request with a key)")
    return conn


def too_large(policy: IdempotencyPolicy) -> HttpResponse:
    """Atomic mode: the handler's writes rolled back with the claim."""
    return policy.problem("response-too-large", 500, f"The response is over {policy.max_response_bytes} bytes, the"
                          " most this service stores for replay; it was not stored and the request's writes were"
                          " rolled back: a retry runs it again.")


def too_large_after_acting(policy: IdempotencyPolicy) -> HttpResponse:
    """External-call mode: the handler acted; this answer is stored for the key, so no retry acts again."""
    return policy.problem("response-too-large", 500, f"The request was carried out, but its response is over"
                          f" {policy.max_response_bytes} bytes, the most this service stores for replay; this"
                          " answer is kept for the key instead, so a retry does not carry it out again.")
