"""A WSGI app for gunicorn in tests/http/test_http_wsgi_chunked.py: the WSGI middleware on the sync store; the handler
records the body it received (its size, in the payments table, in the record's transaction) and echoes its digest."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import text

from idem_dialects import IdempotencyStore
from idem_dialects.http import IdempotencyPolicy
from idem_dialects.http.wsgi import CONNECTION_KEY, IdempotencyMiddleware


def create_app() -> Any:
    prefix = os.environ["TABLE_PREFIX"]
    store = IdempotencyStore.from_url(os.environ["DATABASE_URL"], table_prefix=prefix + "idem_")
    insert = text(f"INSERT INTO {prefix}payments (account, amount) VALUES ('chunked', :n)")

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = environ["wsgi.input"].read()
        environ[CONNECTION_KEY].execute(insert, {"n": len(body)})
        out = json.dumps({"received": len(body), "sha256": hashlib.sha256(body).hexdigest()}).encode()
        start_response("201 Created", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
        return [out]

    limit = int(os.environ["MAX_REQUEST_BYTES"])
    return IdempotencyMiddleware(app, store, IdempotencyPolicy(global_scope=True, max_request_bytes=limit))
