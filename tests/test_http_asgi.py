"""The ASGI side against a real uvicorn server through a real HTTP client (httpx), on SQLite and PostgreSQL.

Every test runs with the ASGI middleware and with the FastAPI route class, on each engine that runs here.
"""

from __future__ import annotations

import asyncio
import importlib.util
import secrets
import socket
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

fastapi = pytest.importorskip("fastapi", reason="the [http] extra (fastapi) is not installed")
httpx = pytest.importorskip("httpx", reason="the [http] extra (httpx) is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the [http] extra (uvicorn) is not installed")

from fastapi.responses import JSONResponse  # noqa: E402
from idem_dialects.engines import Unavailable, get  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import Engine, make_url  # noqa: E402

import idem_dialects  # noqa: E402
from idem_dialects import IdempotencyStore  # noqa: E402
from idem_dialects.http import IdempotencyPolicy  # noqa: E402
from idem_dialects.http.asgi import IdempotencyMiddleware  # noqa: E402
from idem_dialects.http.fastapi import IdemConnection, idempotent_route  # noqa: E402

PROBLEM = "urn:idem-dialects:problem:"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@dataclass
class Database:
    """An engine's async URL for the app, a sync engine for the test's own counting, a table prefix of its own."""

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
    if not hasattr(idem_dialects, "AsyncIdempotencyStore"):
        pytest.skip("idem_dialects.AsyncIdempotencyStore is not in this build (the async store, issue 14)")
    prefix = f"h{secrets.token_hex(3)}_"
    if engine_name == "sqlite":
        path = tmp_path / "asgi.db"
        db = Database(f"sqlite+aiosqlite:///{path}", create_engine(f"sqlite:///{path}"), prefix)
    else:
        try:
            server = get("postgresql").provide()
        except Unavailable as exc:
            pytest.skip(f"postgresql unavailable: {exc}")
        url = make_url(server.url)
        db = Database(url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False),
                      create_engine(url), prefix)
    store = IdempotencyStore(db.sync, table_prefix=prefix + "idem_")
    store.create_tables()
    with db.sync.begin() as conn:
        conn.execute(text(f"CREATE TABLE {prefix}payments (id INTEGER PRIMARY KEY"
                          f"{' GENERATED ALWAYS AS IDENTITY' if engine_name == 'postgresql' else ''},"
                          " account VARCHAR(50) NOT NULL, amount INTEGER)"))
    try:
        yield db
    finally:
        store.drop_tables()
        with db.sync.begin() as conn:
            conn.execute(text(f"DROP TABLE {prefix}payments"))
        db.sync.dispose()


class Uvicorn:
    """A real uvicorn server on a free loopback port, in a thread of this process (so tests can gate handlers)."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self) -> Uvicorn:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            self.thread.join(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


@dataclass
class Service:
    client: httpx.Client
    db: Database
    calls: Counter[str]
    started: threading.Event
    gate: threading.Event

    def post(self, path: str, key: str | None, body: bytes = b'{"amount": 100}', account: str = "acct-1"
             ) -> httpx.Response:
        headers = {"content-type": "application/json", "x-account": account}
        if key is not None:
            headers["idempotency-key"] = key
        return self.client.post(path, content=body, headers=headers)


def build_app(db: Database, form: str, calls: Counter[str], started: threading.Event,
              gate: threading.Event) -> Any:
    store = idem_dialects.AsyncIdempotencyStore.from_url(db.async_url, table_prefix=db.prefix + "idem_")
    atomic = IdempotencyPolicy(scope=lambda r: r.header("x-account"), paths=lambda p: p != "/external")
    external = IdempotencyPolicy(scope=lambda r: r.header("x-account"), paths={"/external"},
                                 lease=timedelta(seconds=30))

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await store.engine.dispose()  # in the server's own event loop

    app = fastapi.FastAPI(lifespan=lifespan)
    router = fastapi.APIRouter(**({"route_class": idempotent_route(store, atomic)} if form == "route" else {}))
    ext_router = fastapi.APIRouter(**({"route_class": idempotent_route(store, external)} if form == "route" else {}))
    insert = text(f"INSERT INTO {db.prefix}payments (account, amount) VALUES (:a, :m) RETURNING id")

    @router.post("/payments", status_code=201)
    async def payments(request: fastapi.Request, response: fastapi.Response, conn: IdemConnection) -> Any:
        calls["payments"] += 1
        body = await request.json()
        pid = (await conn.execute(insert, {"a": request.headers["x-account"], "m": body["amount"]})).scalar_one()
        response.headers["Location"] = f"/payments/{pid}"
        response.headers["X-Trace"] = str(calls["payments"])
        return {"id": pid, "note": "café ✓"}

    @router.post("/explode")
    async def explode(request: fastapi.Request, conn: IdemConnection) -> Any:
        await conn.execute(insert, {"a": request.headers["x-account"], "m": 1})
        raise RuntimeError("after the write")

    @router.post("/flaky")
    async def flaky(request: fastapi.Request, conn: IdemConnection) -> Any:
        calls["flaky"] += 1
        pid = (await conn.execute(insert, {"a": request.headers["x-account"], "m": 5})).scalar_one()
        if calls["flaky"] == 1:
            return JSONResponse({"error": "upstream down"}, status_code=503)
        return JSONResponse({"id": pid}, status_code=201)

    @ext_router.post("/external", status_code=201)
    async def external_call() -> Any:
        calls["external"] += 1
        started.set()
        while not gate.is_set():  # the "external call" in progress until the test lets it finish
            await asyncio.sleep(0.01)
        return {"charged": calls["external"]}

    app.include_router(router)
    app.include_router(ext_router)
    if form == "middleware":
        app.add_middleware(IdempotencyMiddleware, store=store, policy=external)
        app.add_middleware(IdempotencyMiddleware, store=store, policy=atomic)
    return app


@pytest.fixture(params=["middleware", "route"])
def service(request: pytest.FixtureRequest, database: Database) -> Iterator[Service]:
    calls: Counter[str] = Counter()
    started, gate = threading.Event(), threading.Event()
    try:
        with Uvicorn(build_app(database, request.param, calls, started, gate)) as server, \
                httpx.Client(base_url=server.url, timeout=30) as client:
            yield Service(client, database, calls, started, gate)
    finally:
        gate.set()


def problem_of(resp: httpx.Response, slug: str, status: int) -> dict[str, Any]:
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/problem+json"
    doc: dict[str, Any] = resp.json()
    assert doc["type"] == PROBLEM + slug and doc["status"] == status
    return doc


def test_missing_key_is_400_and_nothing_runs(service: Service) -> None:
    problem_of(service.post("/payments", None), "missing-key", 400)
    problem_of(service.post("/payments", "unquoted-key"), "invalid-key", 400)
    assert service.calls["payments"] == 0 and service.db.count("payments") == 0


def test_replay_returns_status_body_bytes_allowed_headers_and_marker(service: Service) -> None:
    first = service.post("/payments", '"pay-1"', b'{"amount": 100, "currency": "EUR"}')
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    again = service.post("/payments", '"pay-1"', b'{ "currency":"EUR",\n "amount":100 }')  # reordered: same request
    assert again.status_code == 201
    assert again.content == first.content
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["content-type"] == first.headers["content-type"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "x-trace" not in again.headers  # not on the allow-list
    assert service.calls["payments"] == 1 and service.db.count("payments") == 1


def test_reuse_with_another_body_is_422(service: Service) -> None:
    assert service.post("/payments", '"pay-2"', b'{"amount": 100}').status_code == 201
    problem_of(service.post("/payments", '"pay-2"', b'{"amount": 101}'), "request-mismatch", 422)
    assert service.calls["payments"] == 1 and service.db.count("payments") == 1


def test_same_key_under_two_scopes_runs_twice(service: Service) -> None:
    a = service.post("/payments", '"shared"', account="acct-1")
    b = service.post("/payments", '"shared"', account="acct-2")
    assert a.status_code == b.status_code == 201 and "idempotent-replayed" not in b.headers
    assert a.json()["id"] != b.json()["id"]
    assert service.db.count("payments") == 2 and service.db.count("idem_records") == 2


def test_concurrent_duplicate_in_external_call_mode_is_409_with_retry_after(service: Service) -> None:
    results: list[httpx.Response] = []
    first = threading.Thread(target=lambda: results.append(service.post("/external", '"ext-1"')))
    first.start()
    assert service.started.wait(30)
    duplicate = service.post("/external", '"ext-1"')
    problem_of(duplicate, "request-in-flight", 409)
    assert int(duplicate.headers["retry-after"]) >= 1
    service.gate.set()
    first.join(30)
    assert results[0].status_code == 201
    replay = service.post("/external", '"ext-1"')
    assert replay.content == results[0].content and replay.headers["idempotent-replayed"] == "true"
    assert service.calls["external"] == 1


def test_handler_raising_after_its_write_leaves_neither_row_nor_record(service: Service) -> None:
    assert service.post("/explode", '"boom"').status_code == 500
    assert service.db.count("payments") == 0 and service.db.count("idem_records") == 0


def test_5xx_is_not_stored_and_the_retry_runs(service: Service) -> None:
    failed = service.post("/flaky", '"flaky-1"')
    assert failed.status_code == 503 and "idempotent-replayed" not in failed.headers
    assert service.db.count("payments") == 0 and service.db.count("idem_records") == 0
    retried = service.post("/flaky", '"flaky-1"')
    assert retried.status_code == 201 and service.calls["flaky"] == 2
    assert service.db.count("payments") == 1 and service.db.count("idem_records") == 1
    assert service.post("/flaky", '"flaky-1"').headers["idempotent-replayed"] == "true"
    assert service.calls["flaky"] == 2


def load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def idempotency_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.rstrip().endswith("# idem")]


def test_fastapi_example_runs_once_per_key_with_at_most_10_lines_of_idempotency(database: Database,
                                                                                engine_name: str) -> None:
    if engine_name != "postgresql":
        pytest.skip("the FastAPI example is the PostgreSQL one (SQLite is the Flask example's)")
    assert 0 < len(idempotency_lines(EXAMPLES / "fastapi_postgres.py")) <= 10
    app = load_example("fastapi_postgres").create_app(database.async_url, table_prefix=database.prefix)
    with Uvicorn(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        headers = {"x-account": "1", "idempotency-key": '"pay-42"'}
        first = client.post("/payments", json={"amount": 100}, headers=headers)
        again = client.post("/payments", json={"amount": 100}, headers=headers)
        other = client.post("/payments", json={"amount": 7}, headers=headers)
    assert first.status_code == again.status_code == 201 and other.status_code == 422
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
    assert again.headers["location"] == first.headers["location"]
    assert database.count("payments") == 1

