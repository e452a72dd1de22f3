"""Real servers for the HTTP tests: the same service (payments, a raising handler, a flaky one, an external call)
built four ways — Flask view decorator and WSGI middleware on a threaded werkzeug server (sync store), ASGI
middleware and FastAPI route class on uvicorn (async store) — on SQLite and PostgreSQL, reached through httpx."""

from __future__ import annotations

import asyncio
import importlib.util
import secrets
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

import idem_dialects
from idem_dialects import IdempotencyStore
from idem_dialects.engines import Unavailable, get
from idem_dialects.http import IdempotencyPolicy, current_connection

httpx = pytest.importorskip("httpx", reason="httpx (the [dev] extra) is not installed")
try:  # at module level: FastAPI resolves the handlers' (string) annotations in this module's globals
    from fastapi import APIRouter, FastAPI, Request, Response
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel

    class Amount(BaseModel):
        amount: int

    from idem_dialects.http.fastapi import IdemConnection, idempotent_route
except ImportError:  # the ASGI stacks skip with the reason
    FastAPI = None

PROBLEM = "https://idem-dialects.readthedocs.io/en/latest/http.html#"
LIMIT = 64 * 1024
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STACKS = ["flask-decorator", "wsgi-middleware", "asgi-middleware", "fastapi-route"]


@dataclass
class Database:
    """A database with tables of this test's own prefix: URLs for the sync and async stores, an engine to count."""

    engine_name: str
    sync_url: str
    async_url: str
    sync: Engine
    prefix: str

    def count(self, table: str) -> int:
        with self.sync.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {self.prefix}{table}")).scalar_one())


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database(engine_name: str, tmp_path: Path) -> Iterator[Database]:
    prefix = f"h{secrets.token_hex(3)}_"
    if engine_name == "sqlite":
        path = tmp_path / "http.db"
        sync_url, async_url = f"sqlite:///{path}", f"sqlite+aiosqlite:///{path}"
    else:
        try:
            url = make_url(get("postgresql").provide().url)
        except Unavailable as exc:
            pytest.skip(f"postgresql unavailable: {exc}")
        sync_url = url.render_as_string(hide_password=False)
        async_url = url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)
    db = Database(engine_name, sync_url, async_url, create_engine(sync_url), prefix)
    store = IdempotencyStore(db.sync, table_prefix=prefix + "idem_")
    store.create_tables()
    identity = " GENERATED ALWAYS AS IDENTITY" if engine_name == "postgresql" else ""
    with db.sync.begin() as conn:
        conn.execute(text(f"CREATE TABLE {prefix}payments (id INTEGER{identity} PRIMARY KEY,"
                          " account VARCHAR(50) NOT NULL, amount INTEGER)"))
    try:
        yield db
    finally:
        store.drop_tables()
        with db.sync.begin() as conn:
            conn.execute(text(f"DROP TABLE {prefix}payments"))
        db.sync.dispose()


@dataclass
class Service:
    client: Any
    db: Database
    calls: Counter[str]
    started: threading.Event
    gate: threading.Event
    limit: int = LIMIT

    def post(self, path: str, key: str | None, body: bytes = b'{"amount": 100}', account: str = "acct-1") -> Any:
        headers = {"content-type": "application/json", "x-account": account}
        if key is not None:
            headers["idempotency-key"] = key
        return self.client.post(path, content=body, headers=headers)

    @staticmethod
    def problem(resp: Any, slug: str, status: int) -> dict[str, Any]:
        assert resp.status_code == status
        assert resp.headers["content-type"] == "application/problem+json"
        doc: dict[str, Any] = resp.json()
        assert doc["type"] == PROBLEM + slug and doc["status"] == status
        return doc


@dataclass
class Hooks:
    """What the handlers share with the test: call counts, and a gate holding the external call open."""

    calls: Counter[str]
    started: threading.Event
    gate: threading.Event


def policies() -> tuple[IdempotencyPolicy, IdempotencyPolicy]:
    atomic = IdempotencyPolicy(scope=lambda r: r.header("x-account"), paths=lambda p: not p.startswith("/external"),
                               max_request_bytes=LIMIT, max_response_bytes=LIMIT)
    external = IdempotencyPolicy(scope=lambda r: r.header("x-account"), paths=lambda p: p.startswith("/external"),
                                 lease=timedelta(seconds=30), max_response_bytes=LIMIT)
    return atomic, external


def flask_app(db: Database, form: str, hooks: Hooks) -> tuple[Any, Callable[[], None]]:
    flask = pytest.importorskip("flask", reason="the [flask] extra is not installed")
    from idem_dialects.http.flask import idempotent_view
    from idem_dialects.http.wsgi import IdempotencyMiddleware

    store = IdempotencyStore.from_url(db.sync_url, table_prefix=db.prefix + "idem_")
    atomic, external = policies()
    app = flask.Flask("http-test")
    insert = text(f"INSERT INTO {db.prefix}payments (account, amount) VALUES (:a, :m) RETURNING id")

    def deco(policy: IdempotencyPolicy) -> Callable[[Any], Any]:
        return idempotent_view(store, policy) if form == "flask-decorator" else (lambda view: view)

    def write(amount: int) -> int:
        return int(current_connection().execute(insert, {"a": flask.request.headers["x-account"], "m": amount})
                   .scalar_one())

    @app.post("/payments")
    @deco(atomic)
    def payments() -> Any:
        hooks.calls["payments"] += 1
        pid = write(flask.request.get_json()["amount"])
        return ({"id": pid, "note": "café ✓"}, 201,
                {"Location": f"/payments/{pid}", "X-Trace": str(hooks.calls["payments"])})

    @app.post("/explode")
    @deco(atomic)
    def explode() -> Any:
        write(1)
        raise RuntimeError("after the write")

    @app.post("/big")
    @deco(atomic)
    def big() -> Any:
        write(2)
        return "x" * (LIMIT + 1), 201

    @app.post("/flaky")
    @deco(atomic)
    def flaky() -> Any:
        hooks.calls["flaky"] += 1
        pid = write(5)
        return ({"error": "upstream down"}, 503) if hooks.calls["flaky"] == 1 else ({"id": pid}, 201)

    @app.post("/throttled")
    @deco(atomic)
    def throttled() -> Any:
        hooks.calls["throttled"] += 1
        if hooks.calls["throttled"] == 1:
            return {"error": "slow down"}, 429, {"Retry-After": "1"}
        return {"id": write(6)}, 201

    @app.post("/external-throttled")
    @deco(external)
    def external_throttled() -> Any:
        hooks.calls["external-throttled"] += 1
        if hooks.calls["external-throttled"] == 1:
            return {"error": "slow down"}, 429, {"Retry-After": "1"}
        return {"charged": hooks.calls["external-throttled"]}, 201

    @app.post("/external-pay")
    @deco(external)
    def external_pay() -> Any:
        hooks.calls["external-pay"] += 1
        return {"charged": hooks.calls["external-pay"]}, 201

    @app.post("/external-big")
    @deco(external)
    def external_big() -> Any:
        hooks.calls["external-big"] += 1
        return "x" * (LIMIT + 1), 201

    @app.post("/gated")
    @deco(atomic)
    def gated() -> Any:
        hooks.calls["gated"] += 1
        pid = write(3)
        hooks.started.set()
        assert hooks.gate.wait(30)
        return {"id": pid}, 201

    @app.post("/external")
    @deco(external)
    def external_call() -> Any:
        hooks.calls["external"] += 1
        hooks.started.set()
        assert hooks.gate.wait(30)
        return {"charged": hooks.calls["external"]}, 201

    if form == "wsgi-middleware":
        app.wsgi_app = IdempotencyMiddleware(IdempotencyMiddleware(app.wsgi_app, store, external), store, atomic)
    return app, store.close


def fastapi_app(db: Database, form: str, hooks: Hooks) -> tuple[Any, Callable[[], None]]:
    if FastAPI is None:
        pytest.skip("the [fastapi] extra is not installed")
    from idem_dialects.http.asgi import IdempotencyMiddleware

    if not hasattr(idem_dialects, "AsyncIdempotencyStore"):
        pytest.skip("idem_dialects.AsyncIdempotencyStore is not in this build (the async store, issue 14)")
    store = idem_dialects.AsyncIdempotencyStore.from_url(db.async_url, table_prefix=db.prefix + "idem_")
    atomic, external = policies()

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await store.engine.dispose()  # in the server's own event loop

    app = FastAPI(lifespan=lifespan)
    routed = form == "fastapi-route"
    router = APIRouter(**({"route_class": idempotent_route(store, atomic)} if routed else {}))
    ext_router = APIRouter(**({"route_class": idempotent_route(store, external)} if routed else {}))
    insert = text(f"INSERT INTO {db.prefix}payments (account, amount) VALUES (:a, :m) RETURNING id")

    async def write(request: Any, conn: Any, amount: int) -> int:
        return int((await conn.execute(insert, {"a": request.headers["x-account"], "m": amount})).scalar_one())

    @router.post("/payments", status_code=201)
    async def payments(request: Request, response: Response, conn: IdemConnection) -> Any:
        hooks.calls["payments"] += 1
        pid = await write(request, conn, (await request.json())["amount"])
        response.headers["Location"] = f"/payments/{pid}"
        response.headers["X-Trace"] = str(hooks.calls["payments"])
        return {"id": pid, "note": "café ✓"}

    @router.post("/explode")
    async def explode(request: Request, conn: IdemConnection) -> Any:
        await write(request, conn, 1)
        raise RuntimeError("after the write")

    @router.post("/big", status_code=201)
    async def big(request: Request, conn: IdemConnection) -> Any:
        await write(request, conn, 2)
        return Response("x" * (LIMIT + 1), status_code=201)

    @router.post("/flaky")
    async def flaky(request: Request, conn: IdemConnection) -> Any:
        hooks.calls["flaky"] += 1
        pid = await write(request, conn, 5)
        if hooks.calls["flaky"] == 1:
            return JSONResponse({"error": "upstream down"}, status_code=503)
        return JSONResponse({"id": pid}, status_code=201)

    @router.post("/throttled")
    async def throttled(request: Request, conn: IdemConnection) -> Any:
        hooks.calls["throttled"] += 1
        if hooks.calls["throttled"] == 1:
            return JSONResponse({"error": "slow down"}, status_code=429, headers={"Retry-After": "1"})
        return JSONResponse({"id": await write(request, conn, 6)}, status_code=201)

    @router.post("/validated", status_code=201)
    async def validated(body: Amount, request: Request, conn: IdemConnection) -> Any:
        hooks.calls["validated"] += 1
        return {"id": await write(request, conn, body.amount)}

    @ext_router.post("/external-throttled")
    async def external_throttled() -> Any:
        hooks.calls["external-throttled"] += 1
        if hooks.calls["external-throttled"] == 1:
            return JSONResponse({"error": "slow down"}, status_code=429, headers={"Retry-After": "1"})
        return JSONResponse({"charged": hooks.calls["external-throttled"]}, status_code=201)

    @ext_router.post("/external-pay", status_code=201)
    async def external_pay() -> Any:
        hooks.calls["external-pay"] += 1
        return {"charged": hooks.calls["external-pay"]}

    @ext_router.post("/external-validated", status_code=201)
    async def external_validated(body: Amount) -> Any:
        hooks.calls["external-validated"] += 1
        return {"charged": body.amount}

    @ext_router.post("/external-big", status_code=201)
    async def external_big() -> Any:
        hooks.calls["external-big"] += 1
        return Response("x" * (LIMIT + 1), status_code=201)

    @router.post("/gated", status_code=201)
    async def gated(request: Request, conn: IdemConnection) -> Any:
        hooks.calls["gated"] += 1
        pid = await write(request, conn, 3)
        hooks.started.set()
        while not hooks.gate.is_set():  # holding the record's transaction open
            await asyncio.sleep(0.01)
        return {"id": pid}

    @ext_router.post("/external", status_code=201)
    async def external_call() -> Any:
        hooks.calls["external"] += 1
        hooks.started.set()
        while not hooks.gate.is_set():  # the external call in progress until the test lets it finish
            await asyncio.sleep(0.01)
        return {"charged": hooks.calls["external"]}

    app.include_router(router)
    app.include_router(ext_router)
    if form == "asgi-middleware":
        app.add_middleware(IdempotencyMiddleware, store=store, policy=external)
        app.add_middleware(IdempotencyMiddleware, store=store, policy=atomic)
    return app, lambda: None


@contextmanager
def werkzeug_server(app: Any) -> Iterator[str]:
    """A real threaded WSGI server on a free loopback port."""
    serving = pytest.importorskip("werkzeug.serving", reason="the [flask] extra (werkzeug) is not installed")
    server = serving.make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(30)


def uvicorn_server(app: Any) -> AbstractContextManager[str]:
    """A real uvicorn server on a free loopback port, in a thread of this process (so tests can gate handlers)."""
    pytest.importorskip("uvicorn", reason="uvicorn (the [dev] extra) is not installed")
    from idem_dialects_bench.http_app import uvicorn_server as serve_uvicorn

    return serve_uvicorn(app)


def serve(stack: str, app: Any) -> AbstractContextManager[str]:
    return werkzeug_server(app) if stack in ("flask-decorator", "wsgi-middleware") else uvicorn_server(app)


@pytest.fixture(params=STACKS)
def service(request: pytest.FixtureRequest, database: Database) -> Iterator[Service]:
    stack: str = request.param
    hooks = Hooks(Counter(), threading.Event(), threading.Event())
    build = flask_app if stack in ("flask-decorator", "wsgi-middleware") else fastapi_app
    app, close = build(database, stack, hooks)
    try:
        with serve(stack, app) as url, httpx.Client(base_url=url, timeout=30) as client:
            yield Service(client, database, hooks.calls, hooks.started, hooks.gate)
    finally:
        hooks.gate.set()
        close()


@pytest.fixture
def load_example() -> Callable[[str], Any]:
    """Import examples/<name>.py as README shows it (examples/ is not a package)."""

    def load(name: str) -> Any:
        spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def serve_app() -> Callable[[str, Any], AbstractContextManager[str]]:
    return serve
