"""A streaming response under the middleware (issue 47): server-sent events are passed through unbuffered, as the
app sends them, with an IdemWarning naming the route, and nothing is stored for them (they are not idempotent: the
docs say to leave such routes out of the policy's paths). Before, the whole stream was buffered, a database
transaction open for it, silently. The ASGI middleware (FastAPI on uvicorn) and the WSGI middleware (Flask on
werkzeug), on SQLite and PostgreSQL; Django's middleware in tests/djangotests/test_django_middleware.py."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest

from idem_dialects import IdempotencyStore, IdemWarning
from idem_dialects.http import IdempotencyPolicy

httpx = pytest.importorskip("httpx", reason="the [http] extra (httpx) is not installed")
Database = Any  # conftest.Database
Serve = Callable[[str, Any], AbstractContextManager[str]]
HEADERS = {"x-account": "a1", "idempotency-key": '"events-1"'}


def events(gate: threading.Event, seen: list[bool]) -> Iterator[bytes]:
    """Two events; the second waits until the client has read the first (which a buffered stream never lets it)."""
    yield b"data: first\n\n"
    seen.append(gate.wait(30))
    yield b"data: second\n\n"


def fastapi_app(db: Database, calls: Counter[str], gate: threading.Event, seen: list[bool]) -> Any:
    fastapi = pytest.importorskip("fastapi", reason="the [fastapi] extra is not installed")
    from fastapi.responses import StreamingResponse
    from http_common import async_store

    from idem_dialects.http.asgi import IdempotencyMiddleware

    store, lifespan = async_store(db)
    app = fastapi.FastAPI(lifespan=lifespan)

    @app.post("/events")
    def stream() -> Any:
        calls["events"] += 1
        return StreamingResponse(events(gate, seen), media_type="text/event-stream")

    app.add_middleware(IdempotencyMiddleware, store=store, policy=IdempotencyPolicy(scope=lambda r: r.header(
        "x-account")))
    return app


def flask_app(db: Database, calls: Counter[str], gate: threading.Event, seen: list[bool]) -> Any:
    flask = pytest.importorskip("flask", reason="the [flask] extra is not installed")
    from idem_dialects.http.wsgi import IdempotencyMiddleware

    store = IdempotencyStore.from_url(db.sync_url, table_prefix=db.prefix + "idem_")
    app = flask.Flask("streams")

    @app.post("/events")
    def stream() -> Any:
        calls["events"] += 1
        return flask.Response(events(gate, seen), mimetype="text/event-stream")

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, store, IdempotencyPolicy(  # type: ignore[method-assign]
        scope=lambda r: r.header("x-account")))
    return app


@pytest.mark.parametrize("stack", ["asgi-middleware", "wsgi-middleware"])
def test_server_sent_events_pass_through_unbuffered_with_a_warning_and_nothing_stored(
        database: Database, serve_app: Serve, stack: str) -> None:
    calls: Counter[str] = Counter()
    gate, seen = threading.Event(), []
    build = fastapi_app if stack == "asgi-middleware" else flask_app
    app = build(database, calls, gate, seen)
    with pytest.warns(IdemWarning, match=r"POST /events streamed its response.*not stored"):
        with serve_app(stack, app) as url, httpx.Client(base_url=url, timeout=60) as client:
            with client.stream("POST", "/events", headers=HEADERS) as resp:
                chunks = resp.iter_bytes()
                first = next(chunks)
                gate.set()  # the client has the first event while the stream is still open
                rest = b"".join(chunks)
            status, content_type = resp.status_code, resp.headers["content-type"]
            again = client.post("/events", headers=HEADERS)  # the gate stays open: read whole
    assert status == 200 and content_type.startswith("text/event-stream")
    assert (first + rest).startswith(b"data: first\n\n") and (first + rest).endswith(b"data: second\n\n")
    assert seen[0] is True  # the first event reached the client before the second was made
    assert again.status_code == 200 and "idempotent-replayed" not in again.headers
    assert calls["events"] == 2 and database.count("idem_records") == 0  # passed through: not idempotent
