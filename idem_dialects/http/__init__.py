"""Idempotency-Key for HTTP services (draft-ietf-httpapi-idempotency-key-header) on the idempotency stores.

This package imports no web framework: the adapters do, when imported themselves —
`idem_dialects.http.wsgi` (any WSGI app), `.flask`, `.asgi` (any ASGI app), `.fastapi`.
"""

from __future__ import annotations

from .core import Call, current_connection, prepare
from .keyheader import KeyHeaderError, parse_key_header
from .policy import DEFAULT_REPLAY_HEADERS, HttpRequest, IdempotencyPolicy
from .problems import PROBLEM_TYPE, HttpResponse, error_problem, problem

__all__ = [
    "DEFAULT_REPLAY_HEADERS",
    "PROBLEM_TYPE",
    "Call",
    "HttpRequest",
    "HttpResponse",
    "IdempotencyPolicy",
    "KeyHeaderError",
    "current_connection",
    "error_problem",
    "parse_key_header",
    "prepare",
    "problem",
]
