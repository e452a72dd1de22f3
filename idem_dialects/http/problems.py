"""RFC 9457 problem details for every answer the idempotency layer gives on its own.

Each problem has a documented `type` URI: the policy's `problem_base` (default `PROBLEM_BASE`, the HTTP page of the
documentation) followed by the slug below, which is that page's anchor for the problem.
Details never include a stored response, a request body or a claim token.

| slug                  | status | when                                                                          |
|-----------------------|--------|-------------------------------------------------------------------------------|
| missing-key           | 400    | the route requires the Idempotency-Key header and the request has none       |
| invalid-key           | 400    | the header is not one Structured Field string, or the key breaks a key rule  |
| unauthenticated       | 401    | the scope callable found no owner for the request (not authenticated)        |
| request-too-large     | 413    | the request body is over `max_request_bytes` (it is refused, not passed on)  |
| request-mismatch      | 422    | the key was first used with a different request; the handler did not run    |
| request-in-flight     | 409    | the first request with this key is still running (`Retry-After` seconds)     |
| lease-lost            | 409    | the claim's lease ran out and another attempt took the key over              |
| response-too-large    | 500    | the response is over `max_response_bytes` (atomic: rolled back; external    |
|                       |        | call: the handler acted, so this answer is stored for the key)               |
| retries-exhausted     | 503    | the database stayed busy/deadlocked past the retry budget (`Retry-After`)    |
| transient             | 503    | another transient condition of the store (`Retry-After`)                     |
| idempotency-error     | (its)  | any other error of the library, with its `http_status` (500 if none); the   |
|                       |        | store's tables missing: 503 with `Retry-After`, naming `idem-dialects init`  |
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import (
    IdemError,
    InvalidKey,
    InvalidPayload,
    LeaseLost,
    MissingTables,
    RequestInFlight,
    RequestMismatch,
    ResponseTooLarge,
    RetriesExhausted,
    TransientError,
)

PROBLEM_TYPE = "application/problem+json"
# Each problem type's documentation: the slug is the anchor of its section in docs/http.md.
PROBLEM_BASE = "https://idem-dialects.readthedocs.io/en/latest/http.html#"

_TITLES: dict[str, str] = {
    "missing-key": "Idempotency key required",
    "invalid-key": "Invalid idempotency key",
    "unauthenticated": "Request has no owner",
    "request-too-large": "Request body too large for an idempotent request",
    "request-mismatch": "Idempotency key reused with a different request",
    "request-in-flight": "A request with this idempotency key is in progress",
    "lease-lost": "The idempotency claim was taken over",
    "response-too-large": "Response too large to store for replay",
    "retries-exhausted": "Database busy, try again",
    "transient": "Database busy, try again",
    "idempotency-error": "Idempotency error",
}
SLUGS = tuple(_TITLES)  # every problem type the layer answers with
# Seconds a client waits before retrying while the store's tables are missing: an operator has to act first.
MISSING_TABLES_RETRY_AFTER = 30


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """A complete, buffered HTTP response: what a handler produced, a replay, or a problem.

    `raw`, when an adapter has it: the same header lines as an ASGI server sends them (lower-case latin-1 bytes) --
    the app's own response head, or a replay's, decoded once per stored head -- so they go out as they are.
    `streamed`: the app streamed it, and the adapter passes it on unbuffered (`core.streamed`): never stored."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    raw: Sequence[tuple[bytes, bytes]] | None = field(default=None, compare=False, repr=False)
    streamed: bool = field(default=False, compare=False)

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)


def problem(slug: str, status: int, detail: str, *, base: str, retry_after: float | None = None) -> HttpResponse:
    """A problem+json response (RFC 9457) of the documented `slug`, with Retry-After when one is given."""
    doc = {"type": base + slug, "title": _TITLES.get(slug, _TITLES["idempotency-error"]), "status": status,
           "detail": detail}
    headers = [("content-type", PROBLEM_TYPE)]
    if retry_after is not None:
        headers.append(("retry-after", retry_after_value(retry_after)))
    return HttpResponse(status, headers, json.dumps(doc, ensure_ascii=False).encode("utf-8"))


def retry_after_value(seconds: float) -> str:
    """Retry-After is whole seconds (RFC 9110 10.2.3): round up, and never tell a client to retry at once."""
    return str(max(1, math.ceil(seconds)))


def error_problem(exc: IdemError, *, base: str) -> HttpResponse:
    """The problem for one of the library's errors, by its type and its `http_status`."""
    status = exc.http_status or 500
    if isinstance(exc, RequestMismatch):
        return problem("request-mismatch", 422, "This idempotency key was first used with a different request"
                       " (method, path, body or fingerprinted headers differ). Use a new key for a new request.",
                       base=base)
    if isinstance(exc, RequestInFlight):
        return problem("request-in-flight", 409, "The first request with this idempotency key has not finished;"
                       " retry after the Retry-After delay to get its result.", base=base,
                       retry_after=exc.retry_after)
    if isinstance(exc, LeaseLost):
        return problem("lease-lost", 409, "This request's claim on the key expired and another attempt took it"
                       " over; its result was not stored. Retry to get the other attempt's result.", base=base,
                       retry_after=1)
    if isinstance(exc, InvalidKey):
        return problem("invalid-key", 400, f"The idempotency key {exc.rule}.", base=base)
    if isinstance(exc, InvalidPayload):
        return problem("idempotency-error", status, f"{exc.field}: {exc.reason}", base=base)
    if isinstance(exc, RetriesExhausted):
        return problem("retries-exhausted", 503, f"The database stayed busy through {exc.attempts} attempts.",
                       base=base, retry_after=1)
    if isinstance(exc, ResponseTooLarge):
        return problem("response-too-large", 500, "The response is larger than this service's database takes in"
                       " one statement, so it could not be stored for replay.", base=base)
    if isinstance(exc, MissingTables):
        return problem("idempotency-error", 503, "This service's idempotency tables do not exist in its database,"
                       " so it cannot take idempotent requests until its operator creates them (`idem-dialects init"
                       " URL`, or store.create_tables()). Nothing was done; retry after the Retry-After delay.",
                       base=base, retry_after=MISSING_TABLES_RETRY_AFTER)
    if isinstance(exc, TransientError):
        return problem("transient", 503, "The idempotency record changed under this request; retry.", base=base,
                       retry_after=1)
    return problem("idempotency-error", status, type(exc).__name__, base=base)
