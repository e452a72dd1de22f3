"""The HTTP-neutral part: which requests take part, what identifies them, what is stored and how it is replayed.

The adapters (WSGI, ASGI, Flask, FastAPI) turn their native request into an `HttpRequest`, ask `prepare` what to do,
and run the handler through a sync or async driver; everything about HTTP semantics lives here, once.

What a request is fingerprinted as: `identity`.

**Stored and replayed.** Status, body bytes exactly, and the headers in `replay_headers` (an allow-list; default
Content-Type, Content-Language, Content-Location, Location, ETag, Last-Modified, Link). Only what a retry should see
is stored: a response the handler made, whose status `store_status(status)` accepts (default 2xx-4xx except 408, 425
and 429; never a 5xx). Any other is answered as is and leaves no record: the transaction rolls back in atomic mode,
the claim is released in external-call mode. Content-Encoding is always kept, whatever `replay_headers` says: it
describes the stored bytes (a compression middleware inside this one compressed them), so a replay without it would
not decode. Whether the handler made it: the route integrations (FastAPI route
class, Flask decorator, Django decorator) know; under plain middleware, a status `framework_status(status)` accepts
(default 3xx, 400, 404, 405, 422: redirects, malformed requests, no route, wrong method, request validation, which a
framework answers before any handler runs) is taken as the framework's and not stored. A framework's HTTP exception
the handler raises (FastAPI/Starlette `HTTPException`, Flask/Werkzeug `abort`, Django `Http404`/`PermissionDenied`,
DRF `APIException`), or another exception an app's handler answers, is an answer it made: the route integrations
turn it into the framework's response for it, as middleware sees it. Its writes roll back all the same (`Raised`):
raising is how a handler undoes its work; the answer is then stored by its status in a transaction of its own.
Middleware learns of it from the framework (`note_raised`). Any other exception is not an answer: it rolls back and
reaches the server unchanged. A replay carries the marker header (`Idempotent-Replayed: true` by default).

**Layers on one request** (`Passage`, in the ASGI scope / WSGI environ): a layer that claims a request notes its
store and the key it claimed there; a layer further in on the same store, or about to claim the same key (scope,
operation, key) through another store object (the same database under another spelling of its URL, say), passes the
request through instead of claiming it again (which would wait on the outer layer's own claim), and a route
integration notes that the handler ran.

**Server-sent events** (`text/event-stream`) are never a complete answer to store: buffering them would hold the
client (and the record's transaction) until the stream ends, if ever. Every layer passes them through unbuffered,
stores nothing for them (their writes roll back in atomic mode, the claim is released in external-call mode) and
warns (`streamed`, an IdemWarning naming the route). Leave such routes out of `paths` / `methods`.

**Limits.** A request body over `max_request_bytes` is refused (413 problem) before any claim. Any other response,
streamed or not, is buffered until it is complete (the record must hold all of it before the first byte leaves);
one over `max_response_bytes`, or over what the database takes in one statement, is refused with a 500
`response-too-large` problem, final for the key: in atomic mode the transaction rolls back (the handler's writes with
it) and the problem is stored in a transaction of its own; in external-call mode the handler has acted, so the claim
is completed with that problem. Every retry receives it instead of a second run.
"""
from __future__ import annotations

import json
import logging
from collections.abc import MutableMapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any

from ..errors import ConfigurationError, IdemError
from ..outcomes import Claimed, InFlight, Mismatch, Outcome, Replayed
from .bodies import BodyOverLimit
from .identity import request_identity
from .keyheader import KeyHeaderError, parse_key_header
from .policy import (
    BODY_HEADERS,
    HttpRequest,
    IdempotencyPolicy,
)
from .problems import HttpResponse, error_problem

PASSAGE_KEY = "idem_dialects.passage"


@dataclass
class Passage:
    """What the idempotency layers on one request tell each other (kept in its ASGI scope / WSGI environ, which
    adapters copy shallowly, so every layer sees the same object)."""

    claimed: set[str] = field(default_factory=set)  # stores (`store_identity`) holding this request's claim
    keys: set[tuple[str, str, str]] = field(default_factory=set)  # (scope, operation, key) claimed for it
    routed: bool = False  # a route integration received the request
    began: bool = False  # ... and its handler produced the response
    raised: bool = False  # the handler answered by raising (a framework's exception handler made the response)


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


def claimed_outside(context: MutableMapping[str, Any] | None, store: str, call: Call | None = None) -> bool:
    """Whether a layer further out already claimed this request on `store`, or the key of `call` on any store: then
    this one passes it through. A store's URL may be spelled several ways (127.0.0.1 and localhost), so the key is
    what tells one claim for sure: a second claim of it would wait on the first, held by this same request."""
    found = None if context is None else context.get(PASSAGE_KEY)
    if not isinstance(found, Passage):
        return False
    return store in found.claimed or (call is not None and call.identity in found.keys)


def note_claim(context: MutableMapping[str, Any] | None, store: str, call: Call) -> None:
    """Before the handler runs: the layers inside it pass the request through (see `claimed_outside`)."""
    found = passage(context)
    if found is not None:
        found.claimed.add(store)
        found.keys.add(call.identity)


def routed(context: MutableMapping[str, Any] | None) -> Passage | None:
    """A route integration marks that it received the request (returns the passage to mark `began` on later). Only
    a passage an outer layer made is marked: without one, nobody further out asks."""
    found = None if context is None else context.get(PASSAGE_KEY)
    if not isinstance(found, Passage):
        return None
    found.routed = True
    return found


def note_raised(context: MutableMapping[str, Any] | None) -> None:
    """An adapter saw the handler raise an exception its framework answered (an HTTP exception, an exception
    handler of the app's): the layer claiming the request rolls the handler's writes back (`Raised`)."""
    found = passage(context)
    if found is not None:
        found.raised = True


def raised_in(context: MutableMapping[str, Any] | None) -> bool:
    """Whether the handler of this request answered by raising (`note_raised`)."""
    found = None if context is None else context.get(PASSAGE_KEY)
    return isinstance(found, Passage) and found.raised


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

    @property
    def identity(self) -> tuple[str, str, str]:
        """The record's identity: one claim of it per request, however many layers it passes."""
        return (self.scope, self.operation, self.key)


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


# --- what is stored and replayed ---------------------------------------------------------------------------------

def encode_stored(policy: IdempotencyPolicy, resp: HttpResponse) -> bytes:
    """The record's response: one JSON line of allow-listed headers, a newline, then the body bytes untouched."""
    headers = [[k.lower(), v] for k, v in resp.headers if k.lower() in policy._replay or k.lower() in BODY_HEADERS]
    return json.dumps(headers, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n" + resp.body


def decode_stored(policy: IdempotencyPolicy, stored: bytes, status: int) -> HttpResponse:
    """A record's response as sent again: the body is the stored bytes after the head; the head (with the replay
    marker) is decoded once per distinct head and marker, as text and as the wire's bytes (`wire_headers`)."""
    cut = stored.find(b"\n")
    head, body = (stored, b"") if cut < 0 else (stored[:cut], stored[cut + 1:])
    found = _heads.get((head, policy.replay_marker))
    if found is None:
        headers = [(str(k), str(v)) for k, v in json.loads(head)]
        headers.append(policy.replay_marker)
        found = (tuple(headers), tuple((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers))
        if len(head) <= _HEAD_CACHED:  # most records of a route share their head; a large one is decoded each time
            if len(_heads) >= _HEADS:
                _heads.clear()
            _heads[(head, policy.replay_marker)] = found
    return HttpResponse(status, list(found[0]), body, raw=found[1])


# Stored heads decoded (head, marker) -> (text headers, wire headers): a bounded cache, emptied when full.
_heads: dict[tuple[bytes, tuple[str, str]], tuple[tuple[tuple[str, str], ...], tuple[tuple[bytes, bytes], ...]]] = {}
_HEADS = 256
_HEAD_CACHED = 1024


def wire_headers(resp: HttpResponse) -> list[tuple[bytes, bytes]]:
    """The response's header lines for an ASGI server (lower-case latin-1 bytes), with a Content-Length: the raw
    ones an adapter kept (the app's own head, a replay's) as they are, others encoded."""
    if resp.raw is not None:
        headers = list(resp.raw)
    else:
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers]
    if not any(k == b"content-length" for k, _ in headers):
        headers.append((b"content-length", b"%d" % len(resp.body)))
    return headers


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


class Raised(Exception):
    """Raised out of the handler by an adapter for an answer the handler gave by raising (`note_raised`): the
    atomic transaction rolls back, the handler's writes with it, and the answer is then stored in a transaction of
    its own if the policy stores its status, so a retry replays it and nothing of the attempt persists."""

    def __init__(self, response: HttpResponse) -> None:
        self.response = response
        super().__init__(response.status)


class Admission(Enum):
    """What a layer does with a request, decided before its body is read (`entry`)."""

    PASS = "pass"  # not the layer's (method, path, no key where none is required): the handler, untouched
    OUTSIDE = "outside"  # a layer further out on this store holds its claim: the handler, the outer layer stores
    CLAIM = "claim"  # this layer's to claim


def entry(policy: IdempotencyPolicy, store: str, method: str, path: str, has_key: bool,
          context: MutableMapping[str, Any] | None) -> Admission:
    """Every integration's first question about a request, asked one way (the key claimed further out through another
    store object is only known once the request is prepared: `exchange` asks that)."""
    if not policy.takes_part(method, path, has_key):
        return Admission.PASS
    return Admission.OUTSIDE if claimed_outside(context, store) else Admission.CLAIM


class HandlerErrors:
    """The handler's own exceptions: re-raised unchanged, never turned into problems (even an IdemError of its own)."""

    __slots__ = ("_conn", "_token", "raised")

    def __init__(self) -> None:
        self.raised: list[BaseException] = []
        self._conn: Any = None
        self._token: Token[Any] | None = None

    def noting(self, conn: Any = None) -> HandlerErrors:
        """Around one call of the handler (``with errors.noting(conn):``): its own exceptions are noted, so `answer`
        re-raises them unchanged; in atomic mode `conn`, the record's transaction, is its `current_connection()`
        meanwhile. The object is its own context manager: no generator per request."""
        self._conn = conn
        return self

    def __enter__(self) -> None:
        self._token = None if self._conn is None else _connection.set(self._conn)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> None:
        if exc is not None and not isinstance(exc, (BodyOverLimit, Raised)):  # the adapter's, not the handler's
            self.raised.append(exc)
        self._conn = None
        if self._token is not None:
            _connection.reset(self._token)
            self._token = None

    def own(self, exc: BaseException) -> bool:
        """Whether `exc` is the handler's own (re-raised unchanged, whatever its type)."""
        return any(exc is e for e in self.raised)

    def forget(self) -> None:
        """Once the request is answered: the exceptions noted are let go (see `exchange`)."""
        self.raised.clear()

    def answer(self, policy: IdempotencyPolicy, exc: BodyOverLimit | IdemError) -> HttpResponse:
        """The problem for an error of the layer or the store; re-raises the handler's own."""
        if self.own(exc):
            try:
                raise exc
            finally:
                del exc  # this frame is in its traceback: holding it would be a reference cycle
        if isinstance(exc, BodyOverLimit):
            return too_large(policy)
        answer = error_problem(exc, base=policy.problem_base)
        if isinstance(exc, ConfigurationError):
            _tell_once(exc, answer.status)
        return answer


log = logging.getLogger(__name__)
_told: set[str] = set()  # the configuration errors already logged in this process


def _tell_once(exc: ConfigurationError, status: int) -> None:
    """A configuration error answers every idempotent request alike (missing tables: 503) until the operator fixes
    it, so its message, which names the fix, is logged once, at WARNING, rather than once per request."""
    text = f"{type(exc).__name__}: {exc}"
    if text not in _told:
        _told.add(text)
        log.warning("answering idempotent requests %d: %s", status, exc)


# The connection of the transaction the atomic-mode handler runs in (a sqlalchemy Connection or AsyncConnection).
_connection: ContextVar[Any] = ContextVar("idem_dialects_http_connection", default=None)


def current_connection(*, required: bool = True) -> Any:
    """The idempotency record's transaction connection, for the handler's business writes (atomic mode only).
    Where there is none (external-call mode, a request passed through untouched): RuntimeError, or None if not
    `required`."""
    conn = _connection.get()
    if conn is None and required:
        raise RuntimeError("no idempotency transaction here: current_connection() works inside a handler run by"
                           " the idempotency middleware/decorator in atomic mode (a request with a key)")
    return conn


def too_large(policy: IdempotencyPolicy) -> HttpResponse:
    """Atomic mode: the handler's writes rolled back with the claim; this answer is then kept for the key."""
    return policy.problem("response-too-large", 500, f"The response is larger than this service stores for replay"
                          f" (at most {policy.max_response_bytes} bytes, and what its database takes in one"
                          " statement): it was not stored and the request's writes were rolled back. This answer is"
                          " kept for the idempotency key instead, so a retry with it does not run the request again.")


def too_large_after_acting(policy: IdempotencyPolicy) -> HttpResponse:
    """External-call mode: the handler acted; this answer is stored for the key, so no retry acts again."""
    return policy.problem("response-too-large", 500, f"The request was carried out, but its response is larger"
                          f" than this service stores for replay (at most {policy.max_response_bytes} bytes, and what"
                          " its database takes in one statement); this answer is kept for the idempotency key"
                          " instead, so a retry does not carry it out again.")
