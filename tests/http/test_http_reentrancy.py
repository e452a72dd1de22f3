"""Made idempotent twice on one route (app middleware plus the route's own integration, one store): the outer layer
holds the claim, the inner passes the request through. Never a self-wait, one handler run, one record; on SQLite and
PostgreSQL, in atomic and external-call (lease) mode, under real servers."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest

import idem_dialects
from idem_dialects import IdempotencyStore
from idem_dialects.http import IdempotencyPolicy

httpx = pytest.importorskip("httpx", reason="the [http] extra (httpx) is not installed")
Database = Any  # conftest.Database
Serve = Callable[[str, Any], AbstractContextManager[str]]
try:  # at module level: FastAPI resolves the endpoints' (string) annotations in this module's globals
    from pydantic import BaseModel

    class Amount(BaseModel):
        amount: int
except ImportError:  # the FastAPI stack skips with its reason
    pass
FIRST_ANSWER_BOUND = 1.0  # seconds; the bound (a self-wait answered after 30 s, or never)


def policy_for(mode: str) -> IdempotencyPolicy:
    lease = timedelta(seconds=30) if mode == "lease" else None
    return IdempotencyPolicy(scope=lambda r: r.header("x-account"), lease=lease)


def fastapi_twice(db: Database, mode: str, calls: Counter[str]) -> tuple[Any, Callable[[], None]]:
    fastapi = pytest.importorskip("fastapi", reason="the [http] extra (fastapi) is not installed")
    from idem_dialects.http.asgi import IdempotencyMiddleware
    from idem_dialects.http.fastapi import idempotent_route

    store = idem_dialects.AsyncIdempotencyStore.from_url(db.async_url, table_prefix=db.prefix + "idem_")

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await store.engine.dispose()

    policy = policy_for(mode)
    app = fastapi.FastAPI(lifespan=lifespan)
    router = fastapi.APIRouter(route_class=idempotent_route(store, policy))

    async def pay(body: Amount) -> Any:
        calls["pay"] += 1
        return {"amount": body.amount, "run": calls["pay"]}

    async def refuse() -> Any:
        calls["refuse"] += 1
        raise fastapi.HTTPException(409, "the handler's own conflict")

    router.add_api_route("/pay", pay, methods=["POST"], status_code=201)
    router.add_api_route("/refuse", refuse, methods=["POST"])
    app.include_router(router)
    app.add_middleware(IdempotencyMiddleware, store=store, policy=policy)
    return app, lambda: None  # the lifespan disposed of the engine, in the server's loop


def flask_twice(db: Database, mode: str, calls: Counter[str]) -> tuple[Any, Callable[[], None]]:
    flask = pytest.importorskip("flask", reason="the [http] extra (flask) is not installed")
    from idem_dialects.http.flask import idempotent_view
    from idem_dialects.http.wsgi import IdempotencyMiddleware

    store = IdempotencyStore.from_url(db.sync_url, table_prefix=db.prefix + "idem_")
    policy = policy_for(mode)
    app = flask.Flask("twice")

    @app.post("/pay")
    @idempotent_view(store, policy)
    def pay() -> Any:
        calls["pay"] += 1
        return {"amount": flask.request.get_json()["amount"], "run": calls["pay"]}, 201

    @app.post("/refuse")
    @idempotent_view(store, policy)
    def refuse() -> Any:
        calls["refuse"] += 1
        flask.abort(409)

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, store, policy)  # type: ignore[method-assign]
    return app, store.close


@pytest.mark.parametrize("mode", ["atomic", "lease"])
@pytest.mark.parametrize("stack", ["fastapi", "flask"])
def test_middleware_and_route_integration_on_one_route_run_the_handler_once(
        database: Database, serve_app: Serve, stack: str, mode: str) -> None:
    if stack == "fastapi" and not hasattr(idem_dialects, "AsyncIdempotencyStore"):
        pytest.skip("idem_dialects.AsyncIdempotencyStore is not in this build")
    calls: Counter[str] = Counter()
    app, close = (fastapi_twice if stack == "fastapi" else flask_twice)(database, mode, calls)
    headers = {"x-account": "a1", "idempotency-key": "7d1c9a40-twice", "content-type": "application/json"}
    try:
        with serve_app("fastapi-route" if stack == "fastapi" else "flask-decorator", app) as url, \
                httpx.Client(base_url=url, timeout=60) as client:
            started = time.monotonic()
            first = client.post("/pay", content=b'{"amount": 3}', headers=headers)
            elapsed = time.monotonic() - started
            assert first.status_code == 201, first.text
            assert elapsed < FIRST_ANSWER_BOUND, f"first answer took {elapsed:.2f} s"
            again = client.post("/pay", content=b'{"amount": 3}', headers=headers)
            assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
            assert again.content == first.content and first.json()["run"] == 1
            # The handler's own refusal (an exception the route integration lets the framework answer) is not stored.
            refuse_headers = dict(headers, **{"idempotency-key": '"refuse-1"'})
            assert client.post("/refuse", headers=refuse_headers).status_code == 409
            assert client.post("/refuse", headers=refuse_headers).status_code == 409
    finally:
        close()
    assert calls["pay"] == 1 and calls["refuse"] == 2
    assert database.count("idem_records") == 1
