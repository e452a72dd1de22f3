"""A request leaves nothing for the garbage collector (issue 48): requests through the ASGI middleware (on Starlette,
as the bench serves it) and the WSGI middleware, first-time, replayed, answered by raising an HTTP exception, and
failing with the handler's own exception, in atomic and external-call (lease) mode, on SQLite and PostgreSQL, make no
reference cycle: every object they make is freed by its reference count, none waits for a collection (whose full
passes pause every request in flight). Counted with the collector stopped and keeping what it finds
(`gc.DEBUG_SAVEALL`), after a warm-up (pools, compiled statements, the stored heads' cache), so nothing here depends
on the machine's speed."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from idem_dialects import IdempotencyStore
from idem_dialects.http import IdempotencyPolicy, current_connection

pytest.importorskip("idem_dialects_bench", reason="the benchmark harness (pip install -e tools/bench)")
from idem_dialects_bench.http import collector_stopped  # what the bench reports of the same, measured one way

Database = Any  # conftest.Database
REQUESTS = 20  # per path, after the warm-up
WARM = 3


class Declined(Exception):
    """The handler's own error: it reaches the caller unchanged."""


def policy_for(mode: str) -> IdempotencyPolicy:
    return IdempotencyPolicy(scope=lambda r: "a1", lease=timedelta(seconds=30) if mode == "lease" else None)


def handler_error(raised: list[BaseException]) -> Declined:
    """A new error of the handler's own, remembered (until the caller takes it back) to compare with what it got."""
    error = Declined("the handler's own")
    raised.append(error)
    return error


def starlette_app(store: Any, mode: str, insert: Any, raised: list[BaseException]) -> Any:
    pytest.importorskip("starlette", reason="the [fastapi] extra (starlette) is not installed")
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from idem_dialects.http.asgi import IdempotencyMiddleware

    async def pay(request: Request) -> JSONResponse:
        amount = (await request.json())["amount"]
        conn = current_connection(required=False)
        if conn is not None:  # atomic mode: the write in the record's transaction
            await conn.execute(insert, {"m": amount})
        return JSONResponse({"paid": amount}, status_code=201)

    async def refused(request: Request) -> JSONResponse:
        raise HTTPException(409, "the handler's answer, raised")

    async def boom(request: Request) -> JSONResponse:
        raise handler_error(raised)

    app = Starlette(routes=[Route("/pay", pay, methods=["POST"]), Route("/refused", refused, methods=["POST"]),
                            Route("/boom", boom, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, store=store, policy=policy_for(mode))
    return app


async def asgi_call(app: Any, path: str, key: str) -> int:
    """One request as a server makes it; the status sent."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "scheme": "http",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000), "state": {},
             "headers": [(b"host", b"test"), (b"idempotency-key", f'"{key}"'.encode()),
                         (b"content-type", b"application/json"), (b"content-length", b"13")]}
    sent: list[int] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if received:  # nothing comes after the body until the client goes away
            await asyncio.Event().wait()
        received = True
        return {"type": "http.request", "body": b'{"amount": 1}', "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            sent.append(message["status"])

    await app(scope, receive, send)
    return sent[0]


async def raising(call: Callable[[], Awaitable[object]], raised: list[BaseException]) -> None:
    """`call()` fails with the handler's own error, the very object it raised. (Not `pytest.raises`: its
    ExceptionInfo, held by this frame, which the error's traceback holds, would be a cycle of the test's own.)"""
    try:
        await call()
    except Declined as caught:
        assert caught is raised.pop()
    else:
        pytest.fail("the handler's error did not reach the caller")


@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_asgi_requests_leave_no_cyclic_garbage(database: Database, mode: str) -> None:
    pytest.importorskip("greenlet", reason="the [async] extra (greenlet) is not installed")
    from idem_dialects import AsyncIdempotencyStore

    insert = text(f"INSERT INTO {database.prefix}payments (account, amount) VALUES ('a1', :m)")

    async def scenario() -> dict[str, Counter[str]]:
        store = AsyncIdempotencyStore.from_url(database.async_url, table_prefix=database.prefix + "idem_")
        raised: list[BaseException] = []
        app = starlette_app(store, mode, insert, raised)
        paths: dict[str, tuple[int, Callable[[str], Awaitable[object]]]] = {
            "first-time": (201, lambda key: asgi_call(app, "/pay", f"pay-{key}")),
            "replay": (201, lambda key: asgi_call(app, "/pay", "pay-w0")),
            "mismatch": (422, lambda key: asgi_call(app, "/refused", "pay-w0")),  # the key, another request
            "answered by raising": (409, lambda key: asgi_call(app, "/refused", f"refused-{key}")),
            "the handler's own error": (0, lambda key: raising(lambda: asgi_call(app, "/boom", f"boom-{key}"),
                                                               raised)),
        }
        found: dict[str, Counter[str]] = {}
        try:
            for path, (status, call) in paths.items():
                for i in range(WARM):
                    assert await call(f"w{i}") in (status, None)
                with collector_stopped() as left:
                    for i in range(REQUESTS):
                        assert await call(str(i)) in (status, None)
                found[path] = left.cyclic
        finally:
            await store.close()
        return found

    paths = ["first-time", "replay", "mismatch", "answered by raising", "the handler's own error"]
    assert asyncio.run(scenario()) == {path: Counter() for path in paths}


def wsgi_app(insert: Any, raised: list[BaseException]) -> Any:
    """A plain WSGI app (Flask makes cycles of its own on every request): a payment, and a handler that fails."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        environ["wsgi.input"].read()
        if environ["PATH_INFO"] == "/boom":
            raise handler_error(raised)
        conn = current_connection(required=False)
        if conn is not None:
            conn.execute(insert, {"m": 1})
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"paid": 1}']

    return app


def wsgi_call(app: Any, path: str, key: str) -> str:
    body = b'{"amount": 1}'
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
               "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
               "HTTP_IDEMPOTENCY_KEY": f'"{key}"'}
    started: list[str] = []
    b"".join(app(environ, lambda status, headers, exc_info=None: started.append(status)))
    return started[0]


@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_wsgi_requests_leave_no_cyclic_garbage(database: Database, mode: str) -> None:
    from idem_dialects.http.wsgi import IdempotencyMiddleware

    insert = text(f"INSERT INTO {database.prefix}payments (account, amount) VALUES ('a1', :m)")
    raised: list[BaseException] = []
    with IdempotencyStore.from_url(database.sync_url, table_prefix=database.prefix + "idem_") as store:
        app = IdempotencyMiddleware(wsgi_app(insert, raised), store, policy_for(mode))

        def fails(key: str) -> None:
            try:
                wsgi_call(app, "/boom", f"boom-{key}")
            except Declined as caught:  # as in `raising`
                assert caught is raised.pop()
            else:
                pytest.fail("the handler's error did not reach the caller")

        paths: dict[str, Callable[[str], object]] = {
            "first-time": lambda key: wsgi_call(app, "/pay", f"pay-{key}"),
            "replay": lambda key: wsgi_call(app, "/pay", "pay-w0"),
            "mismatch": lambda key: wsgi_call(app, "/boom", "pay-w0"),  # the key, another request
            "the handler's own error": fails,
        }
        found: dict[str, Counter[str]] = {}
        for path, call in paths.items():
            for i in range(WARM):
                assert call(f"w{i}") in ("201 Created", "422 Unprocessable Entity", None)
            with collector_stopped() as left:
                for i in range(REQUESTS):
                    assert call(str(i)) in ("201 Created", "422 Unprocessable Entity", None)
            found[path] = left.cyclic
    assert found == {path: Counter() for path in paths}
