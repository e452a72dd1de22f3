"""An answer the handler gives by raising (issue 47): a framework's HTTP exception after a write rolls the write back,
and the answer is stored for the key in a transaction of its own, so the retry replays it and runs nothing. FastAPI
(route class and ASGI middleware), Starlette (ASGI middleware) and Flask (view decorator) on real servers, on SQLite
and PostgreSQL; Django and DRF in tests/djangotests/test_django_views.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
from sqlalchemy import text

from idem_dialects import IdempotencyStore
from idem_dialects.http import IdempotencyPolicy, current_connection

httpx = pytest.importorskip("httpx", reason="the [http] extra (httpx) is not installed")
Database = Any  # conftest.Database
Serve = Callable[[str, Any], AbstractContextManager[str]]
KEY = {"x-account": "a1", "idempotency-key": '"refused-1"'}


def policy() -> IdempotencyPolicy:
    return IdempotencyPolicy(scope=lambda r: r.header("x-account"))


def insert(db: Database) -> Any:
    return text(f"INSERT INTO {db.prefix}payments (account, amount) VALUES ('a1', 7)")


@contextmanager
def asgi_served(db: Database, serve: Serve, app_of: Callable[[Any], Any]) -> Iterator[Any]:
    """`app_of(lifespan)` served on uvicorn with the async store; yields an httpx client."""
    from http_common import async_store

    with serve("asgi-middleware", app_of(async_store(db))) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def fastapi_app(db: Database, wiring: str, calls: Counter[str]) -> Callable[[Any], Any]:
    fastapi = pytest.importorskip("fastapi", reason="the [fastapi] extra is not installed")
    from idem_dialects.http.asgi import IdempotencyMiddleware
    from idem_dialects.http.fastapi import idempotent_route

    def build(made: Any) -> Any:
        store, lifespan = made
        app = fastapi.FastAPI(lifespan=lifespan)
        router = (fastapi.APIRouter(route_class=idempotent_route(store, policy())) if wiring == "route"
                  else fastapi.APIRouter())

        async def pay() -> Any:
            calls["pay"] += 1
            await current_connection().execute(insert(db))
            raise fastapi.HTTPException(409, "duplicate order", headers={"content-language": "en"})

        router.add_api_route("/pay", pay, methods=["POST"])
        app.include_router(router)
        if wiring == "middleware":
            app.add_middleware(IdempotencyMiddleware, store=store, policy=policy())
        return app

    return build


def starlette_app(db: Database, calls: Counter[str]) -> Callable[[Any], Any]:
    pytest.importorskip("starlette", reason="the [fastapi] extra (starlette) is not installed")
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from idem_dialects.http.asgi import IdempotencyMiddleware

    class Declined(Exception):
        """An application exception its own handler answers."""

    def build(made: Any) -> Any:
        store, lifespan = made

        async def pay(request: Request) -> Any:
            calls["pay"] += 1
            await current_connection().execute(insert(db))
            if request.query_params.get("how") == "handler":
                raise Declined()
            raise HTTPException(409, "duplicate order")

        async def declined(request: Request, exc: Exception) -> Any:
            return JSONResponse({"error": "card declined"}, status_code=402)

        return Starlette(routes=[Route("/pay", pay, methods=["POST"])], lifespan=lifespan,
                         exception_handlers={Declined: declined},
                         middleware=[Middleware(IdempotencyMiddleware, store=store, policy=policy())])

    return build


@pytest.mark.parametrize("wiring", ["route", "middleware"])
def test_fastapi_an_http_exception_after_a_write_rolls_it_back_and_the_retry_replays_it(
        database: Database, serve_app: Serve, wiring: str) -> None:
    calls: Counter[str] = Counter()
    with asgi_served(database, serve_app, fastapi_app(database, wiring, calls)) as client:
        first = client.post("/pay", headers=KEY)
        again = client.post("/pay", headers=KEY)
    assert first.status_code == again.status_code == 409 and first.json() == {"detail": "duplicate order"}
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert again.headers["content-language"] == "en"
    assert calls["pay"] == 1 and database.count("payments") == 0 and database.count("idem_records") == 1


@pytest.mark.parametrize("how", ["http-exception", "handler"])
def test_starlette_an_exception_answered_after_a_write_rolls_it_back_and_the_retry_replays_it(
        database: Database, serve_app: Serve, how: str) -> None:
    calls: Counter[str] = Counter()
    status = 409 if how == "http-exception" else 402
    with asgi_served(database, serve_app, starlette_app(database, calls)) as client:
        first = client.post(f"/pay?how={how}", headers=KEY)
        again = client.post(f"/pay?how={how}", headers=KEY)
    assert first.status_code == again.status_code == status, first.text
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert calls["pay"] == 1 and database.count("payments") == 0 and database.count("idem_records") == 1


def test_flask_an_abort_after_a_write_rolls_it_back_and_the_retry_replays_it(database: Database,
                                                                            serve_app: Serve) -> None:
    flask = pytest.importorskip("flask", reason="the [flask] extra is not installed")
    from idem_dialects.http.flask import idempotent_view

    calls: Counter[str] = Counter()
    store = IdempotencyStore.from_url(database.sync_url, table_prefix=database.prefix + "idem_")
    app = flask.Flask("raised")

    @app.post("/pay")
    @idempotent_view(store, policy())
    def pay() -> Any:
        calls["pay"] += 1
        current_connection().execute(insert(database))
        flask.abort(409, "duplicate order")

    try:
        with serve_app("flask-decorator", app) as url, httpx.Client(base_url=url, timeout=30) as client:
            first = client.post("/pay", headers=KEY)
            again = client.post("/pay", headers=KEY)
    finally:
        store.close()
    assert first.status_code == again.status_code == 409 and b"duplicate order" in first.content
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert calls["pay"] == 1 and database.count("payments") == 0 and database.count("idem_records") == 1
