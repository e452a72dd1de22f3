"""Made idempotent twice on one route (app middleware plus the route's own integration, one store): the outer layer
holds the claim, the inner passes the request through. Never a self-wait, one handler run, one record; on SQLite and
PostgreSQL, in atomic and external-call (lease) mode, under real servers."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url

import idem_dialects
from idem_dialects import IdempotencyStore
from idem_dialects.http import IdempotencyPolicy

httpx = pytest.importorskip("httpx", reason="httpx (the [dev] extra) is not installed")
Database = Any  # conftest.Database
Serve = Callable[[str, Any], AbstractContextManager[str]]
try:  # at module level: FastAPI resolves the endpoints' (string) annotations in this module's globals
    from pydantic import BaseModel

    class Amount(BaseModel):
        amount: int
except ImportError:  # the FastAPI stack skips with its reason
    pass
# A request that waited on its own claim would be answered after a lock wait the store retried (counted in its
# `retries`), with the inner layer's 409, or never (the client's timeout): each fails the checks below, on a machine
# however loaded, where a bound on the answer's time would tell them apart only on a quiet one.


def policy_for(mode: str) -> IdempotencyPolicy:
    lease = timedelta(seconds=30) if mode == "lease" else None
    return IdempotencyPolicy(scope=lambda r: r.header("x-account"), lease=lease)


def fastapi_twice(db: Database, mode: str, calls: Counter[str]) -> tuple[Any, Callable[[], None], Any]:
    fastapi = pytest.importorskip("fastapi", reason="the [fastapi] extra is not installed")
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
    return app, lambda: None, store  # the lifespan disposed of the engine, in the server's loop


def flask_twice(db: Database, mode: str, calls: Counter[str]) -> tuple[Any, Callable[[], None], Any]:
    flask = pytest.importorskip("flask", reason="the [flask] extra is not installed")
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
    return app, store.close, store


@pytest.mark.parametrize("mode", ["atomic", "lease"])
@pytest.mark.parametrize("stack", ["fastapi", "flask"])
def test_middleware_and_route_integration_on_one_route_run_the_handler_once(
        database: Database, serve_app: Serve, stack: str, mode: str) -> None:
    if stack == "fastapi" and not hasattr(idem_dialects, "AsyncIdempotencyStore"):
        pytest.skip("idem_dialects.AsyncIdempotencyStore is not in this build")
    calls: Counter[str] = Counter()
    app, close, store = (fastapi_twice if stack == "fastapi" else flask_twice)(database, mode, calls)
    headers = {"x-account": "a1", "idempotency-key": "7d1c9a40-twice", "content-type": "application/json"}
    try:
        with serve_app("fastapi-route" if stack == "fastapi" else "flask-decorator", app) as url, \
                httpx.Client(base_url=url, timeout=60) as client:
            first = client.post("/pay", content=b'{"amount": 3}', headers=headers)
            assert first.status_code == 201, first.text
            assert store.retries == Counter(), "the first request waited on a lock (its own claim?)"
            again = client.post("/pay", content=b'{"amount": 3}', headers=headers)
            assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
            assert again.content == first.content and first.json()["run"] == 1
            # The handler's own refusal, raised as the framework's HTTP exception, is its answer: stored once.
            refuse_headers = dict(headers, **{"idempotency-key": '"refuse-1"'})
            assert client.post("/refuse", headers=refuse_headers).status_code == 409
            refused = client.post("/refuse", headers=refuse_headers)
            assert refused.status_code == 409 and refused.headers["idempotent-replayed"] == "true"
    finally:
        close()
    assert calls["pay"] == 1 and calls["refuse"] == 1
    assert database.count("idem_records") == 2


def respelled(url: str) -> str:
    """The same database under another spelling of its URL: localhost for 127.0.0.1, a path through "./"."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        assert parsed.database
        path = Path(parsed.database)
        return parsed.set(database=f"{path.parent}/./{path.name}").render_as_string(hide_password=False)
    assert parsed.host == "127.0.0.1", parsed.host
    return parsed.set(host="localhost").render_as_string(hide_password=False)


@pytest.mark.parametrize("mode", ["atomic", "lease"])
@pytest.mark.parametrize("stack", ["fastapi", "flask"])
def test_two_store_objects_on_one_database_spelled_two_ways_run_the_handler_once(
        database: Database, serve_app: Serve, stack: str, mode: str) -> None:
    """The middleware's store and the route integration's store are two objects whose URLs differ in spelling only:
    the inner layer recognises the key the outer one claimed for this request and passes it through (claiming it
    again would wait on that claim: no answer, or one after a lock wait retried, in atomic mode; the inner 409 stored
    in lease mode)."""
    calls: Counter[str] = Counter()
    policy = policy_for(mode)
    if stack == "fastapi":
        fastapi = pytest.importorskip("fastapi", reason="the [http] extra (fastapi) is not installed")
        from idem_dialects.http.asgi import IdempotencyMiddleware
        from idem_dialects.http.fastapi import idempotent_route

        outer = idem_dialects.AsyncIdempotencyStore.from_url(database.async_url, table_prefix=database.prefix + "idem_")
        inner = idem_dialects.AsyncIdempotencyStore.from_url(respelled(database.async_url),
                                                              table_prefix=database.prefix + "idem_")

        @asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            yield
            await outer.engine.dispose()
            await inner.engine.dispose()

        app = fastapi.FastAPI(lifespan=lifespan)
        router = fastapi.APIRouter(route_class=idempotent_route(inner, policy))

        async def pay(body: Amount) -> Any:
            calls["pay"] += 1
            return {"amount": body.amount, "run": calls["pay"]}

        router.add_api_route("/pay", pay, methods=["POST"], status_code=201)
        app.include_router(router)
        app.add_middleware(IdempotencyMiddleware, store=outer, policy=policy)
        close: Callable[[], None] = lambda: None  # noqa: E731
        layers: list[Any] = [outer, inner]
    else:
        flask = pytest.importorskip("flask", reason="the [http] extra (flask) is not installed")
        from idem_dialects.http.flask import idempotent_view
        from idem_dialects.http.wsgi import IdempotencyMiddleware as WsgiMiddleware

        sync_outer = IdempotencyStore.from_url(database.sync_url, table_prefix=database.prefix + "idem_")
        sync_inner = IdempotencyStore.from_url(respelled(database.sync_url), table_prefix=database.prefix + "idem_")
        app = flask.Flask("respelled")

        @app.post("/pay")
        @idempotent_view(sync_inner, policy)
        def pay_view() -> Any:
            calls["pay"] += 1
            return {"amount": flask.request.get_json()["amount"], "run": calls["pay"]}, 201

        app.wsgi_app = WsgiMiddleware(app.wsgi_app, sync_outer, policy)  # type: ignore[method-assign]

        def close() -> None:
            sync_outer.close()
            sync_inner.close()

        layers = [sync_outer, sync_inner]

    headers = {"x-account": "a1", "idempotency-key": '"respelled-1"', "content-type": "application/json"}
    try:
        with serve_app("fastapi-route" if stack == "fastapi" else "flask-decorator", app) as url, \
                httpx.Client(base_url=url, timeout=60) as client:
            first = client.post("/pay", content=b'{"amount": 3}', headers=headers)
            again = client.post("/pay", content=b'{"amount": 3}', headers=headers)
    finally:
        close()
    assert first.status_code == 201, first.text
    assert [layer.retries for layer in layers] == [Counter(), Counter()], "a lock wait was retried (its own claim?)"
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content and calls["pay"] == 1
    assert database.count("idem_records") == 1
