"""The edges of HTTP (issue 40): every integration wired every way gives one answer for one key. Real servers
(uvicorn, threaded werkzeug) through httpx, on SQLite and PostgreSQL: a compression middleware inside the
idempotency one, multipart and form bodies encoded anew by a retry, a framework's HTTP exception raised by the
handler, the conflict answer on SQLite, the record's connection in external-call mode, the caller's ASGI scope, and
tables that are gone."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

import pytest

import idem_dialects
from idem_dialects import IdempotencyStore
from idem_dialects.http import IdempotencyPolicy

httpx = pytest.importorskip("httpx", reason="the [http] extra (httpx) is not installed")
try:  # at module level: FastAPI resolves the endpoints' (string) annotations in this module's globals
    from fastapi import APIRouter, FastAPI, HTTPException

    from idem_dialects.http.fastapi import IdemConnection
except ImportError:  # the ASGI tests skip with the reason
    FastAPI = None
Database = Any  # conftest.Database
Serve = Callable[[str, Any], AbstractContextManager[str]]
PROBLEM = "https://idem-dialects.readthedocs.io/en/latest/http.html#"
HEADERS = {"x-account": "a1"}


def policy(**options: Any) -> IdempotencyPolicy:
    return IdempotencyPolicy(scope=lambda r: r.header("x-account"), **options)


@contextmanager
def fastapi_served(db: Database, serve: Serve, wiring: str, routes: Callable[[Any], None],
                   chosen: IdempotencyPolicy | None = None, inside: Callable[[Any], None] | None = None
                   ) -> Iterator[Any]:
    """A FastAPI app on uvicorn whose `routes(router)` are made idempotent by the ASGI middleware ("middleware"),
    the route class ("route") or both on one store ("both"); `inside(app)` adds middleware inside the idempotency
    one. Yields an httpx client."""
    if FastAPI is None:
        pytest.skip("the [http] extra (fastapi) is not installed")
    from idem_dialects.http.asgi import IdempotencyMiddleware
    from idem_dialects.http.fastapi import idempotent_route

    store = idem_dialects.AsyncIdempotencyStore.from_url(db.async_url, table_prefix=db.prefix + "idem_")
    chosen = chosen or policy()

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await store.engine.dispose()  # in the server's own loop

    app = FastAPI(lifespan=lifespan)
    router = APIRouter(route_class=idempotent_route(store, chosen)) if wiring in ("route", "both") else APIRouter()
    routes(router)
    app.include_router(router)
    if inside is not None:
        inside(app)
    if wiring in ("middleware", "both"):
        app.add_middleware(IdempotencyMiddleware, store=store, policy=chosen)  # added last: the outermost
    with serve("fastapi-route", app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


@contextmanager
def flask_served(db: Database, serve: Serve, wiring: str, routes: Callable[[Any, Callable[[Any], Any]], None],
                 chosen: IdempotencyPolicy | None = None) -> Iterator[Any]:
    """A Flask app on a threaded werkzeug server whose `routes(app, decorate)` are made idempotent by the WSGI
    middleware ("middleware"), the view decorator ("route") or both on one store ("both")."""
    flask = pytest.importorskip("flask", reason="the [http] extra (flask) is not installed")
    from idem_dialects.http.flask import idempotent_view
    from idem_dialects.http.wsgi import IdempotencyMiddleware

    store = IdempotencyStore.from_url(db.sync_url, table_prefix=db.prefix + "idem_")
    chosen = chosen or policy()
    app = flask.Flask("edges")
    routes(app, idempotent_view(store, chosen) if wiring in ("route", "both") else (lambda view: view))
    if wiring in ("middleware", "both"):
        app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, store, chosen)  # type: ignore[method-assign]
    try:
        with serve("flask-decorator", app) as url, httpx.Client(base_url=url, timeout=30) as client:
            yield client
    finally:
        store.close()


def replayed(resp: Any) -> bool:
    return resp.headers.get("idempotent-replayed") == "true"


# --- item 9: a raised HTTPException is stored by one rule -----------------------------------------------------------

@pytest.mark.parametrize("wiring", ["middleware", "route", "both"])
def test_a_raised_http_exception_is_stored_alike_under_every_fastapi_wiring(
        database: Database, serve_app: Serve, wiring: str) -> None:
    calls: Counter[str] = Counter()

    def routes(router: Any) -> None:
        async def pay() -> Any:
            calls["pay"] += 1
            raise HTTPException(402, "card declined", headers={"content-language": "en"})

        router.add_api_route("/pay", pay, methods=["POST"])

    with fastapi_served(database, serve_app, wiring, routes) as client:
        key = dict(HEADERS, **{"idempotency-key": '"declined-1"'})
        first = client.post("/pay", headers=key)
        again = client.post("/pay", headers=key)
    assert first.status_code == again.status_code == 402 and first.json() == {"detail": "card declined"}
    assert not replayed(first) and replayed(again) and again.content == first.content
    assert again.headers["content-language"] == "en"
    assert calls["pay"] == 1 and database.count("idem_records") == 1


@pytest.mark.parametrize("wiring", ["middleware", "route", "both"])
def test_a_raised_abort_is_stored_alike_under_every_flask_wiring(database: Database, serve_app: Serve,
                                                                wiring: str) -> None:
    exceptions = pytest.importorskip("werkzeug.exceptions", reason="the [http] extra (flask) is not installed")
    calls: Counter[str] = Counter()

    class Declined(exceptions.HTTPException):  # type: ignore[misc,name-defined]
        code = 402

    def routes(app: Any, decorate: Callable[[Any], Any]) -> None:
        @app.post("/pay")
        @decorate
        def pay() -> Any:
            calls["pay"] += 1
            raise Declined()

        @app.errorhandler(Declined)
        def declined(exc: Any) -> Any:
            return {"error": "card declined"}, 402

    with flask_served(database, serve_app, wiring, routes) as client:
        key = dict(HEADERS, **{"idempotency-key": '"declined-2"'})
        first = client.post("/pay", headers=key)
        again = client.post("/pay", headers=key)
    assert first.status_code == again.status_code == 402 and first.json() == {"error": "card declined"}
    assert not replayed(first) and replayed(again) and again.content == first.content
    assert calls["pay"] == 1 and database.count("idem_records") == 1


# --- item 6: compression inside the idempotency middleware ---------------------------------------------------------

def test_a_replay_of_a_response_compressed_inside_the_middleware_decodes_to_the_first_body(
        database: Database, serve_app: Serve) -> None:
    from starlette.middleware.gzip import GZipMiddleware

    calls: Counter[str] = Counter()

    def routes(router: Any) -> None:
        async def report() -> Any:
            calls["report"] += 1
            return {"rows": [f"row {n}: " + "x" * 40 for n in range(50)], "run": calls["report"]}

        router.add_api_route("/report", report, methods=["POST"], status_code=201)

    def gzip_inside(app: Any) -> None:
        app.add_middleware(GZipMiddleware, minimum_size=100)

    with fastapi_served(database, serve_app, "middleware", routes, inside=gzip_inside) as client:
        key = dict(HEADERS, **{"idempotency-key": '"report-1"', "accept-encoding": "gzip"})
        first = client.post("/report", headers=key)
        again = client.post("/report", headers=key)
    assert first.status_code == again.status_code == 201 and first.headers["content-encoding"] == "gzip"
    assert replayed(again) and again.headers["content-encoding"] == "gzip"
    assert again.json() == first.json() and first.json()["run"] == 1  # httpx decoded both the same way
    assert calls["report"] == 1


# --- item 7: multipart and form bodies -------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", ["asgi-middleware", "flask-decorator"])
def test_a_form_encoded_anew_by_a_retry_replays_and_another_form_is_a_mismatch(
        database: Database, serve_app: Serve, stack: str) -> None:
    calls: Counter[str] = Counter()

    def fastapi_routes(router: Any) -> None:
        async def upload() -> Any:
            calls["upload"] += 1
            return {"run": calls["upload"]}

        router.add_api_route("/upload", upload, methods=["POST"], status_code=201)

    def flask_routes(app: Any, decorate: Callable[[Any], Any]) -> None:
        @app.post("/upload")
        @decorate
        def upload() -> Any:
            calls["upload"] += 1
            return {"run": calls["upload"]}, 201

    served = (fastapi_served(database, serve_app, "middleware", fastapi_routes) if stack == "asgi-middleware"
              else flask_served(database, serve_app, "route", flask_routes))
    fields, files = {"amount": "100", "note": "café ✓"}, {"receipt": ("r.txt", b"line 1\r\n--line 2\r\n", "text/plain")}
    with served as client:
        key = dict(HEADERS, **{"idempotency-key": '"upload-1"'})
        first = client.post("/upload", data=fields, files=files, headers=key)
        again = client.post("/upload", data=fields, files=files, headers=key)  # httpx picks a new boundary
        other = client.post("/upload", data=dict(fields, amount="101"), files=files, headers=key)
        form = dict(HEADERS, **{"idempotency-key": '"form-1"', "content-type": "application/x-www-form-urlencoded"})
        plain = client.post("/upload", content=b"note=caf%C3%A9+ok&amount=5", headers=form)
        respelled = client.post("/upload", content=b"note=caf%c3%a9%20ok&amount=5", headers=form)
        changed = client.post("/upload", content=b"note=cafe+ok&amount=5", headers=form)
    assert first.request.headers["content-type"] != again.request.headers["content-type"]  # two boundaries
    assert first.status_code == again.status_code == 201 and replayed(again) and again.content == first.content
    assert other.status_code == 422 and other.json()["type"] == PROBLEM + "request-mismatch"
    assert plain.status_code == respelled.status_code == 201 and replayed(respelled)
    assert changed.status_code == 422
    assert calls["upload"] == 2


# --- item 10 (issue 47): SQLite's conflict answer is for the key in flight only ----------------------------------

def test_on_sqlite_conflict_mode_answers_409_for_the_key_in_flight_and_another_key_waits(
        database: Database, serve_app: Serve) -> None:
    if database.engine_name != "sqlite":
        pytest.skip("only a database with one write lock could mistake another key for this one")
    started, gate = threading.Event(), threading.Event()
    calls: Counter[str] = Counter()

    def routes(app: Any, decorate: Callable[[Any], Any]) -> None:
        @app.post("/slow")
        @decorate
        def slow() -> Any:
            calls["slow"] += 1
            started.set()
            assert gate.wait(30)
            return {"slow": True}, 201

        @app.post("/quick")
        @decorate
        def quick() -> Any:
            calls["quick"] += 1
            return {"quick": True}, 201

    slow_key = dict(HEADERS, **{"idempotency-key": '"slow-1"'})
    with flask_served(database, serve_app, "route", routes, policy(on_in_flight="conflict")) as client:
        results: dict[str, Any] = {}
        holder = threading.Thread(target=lambda: results.update(slow=client.post("/slow", headers=slow_key)))
        holder.start()
        try:
            assert started.wait(30)
            same = client.post("/slow", headers=slow_key)  # the key in flight: 409 at once
            other = threading.Thread(target=lambda: results.update(quick=client.post(
                "/quick", headers=dict(HEADERS, **{"idempotency-key": '"quick-1"'}))))
            other.start()  # another key: it waits for the write lock instead of a 409
        finally:
            gate.set()
            holder.join(30)
        other.join(30)
        replay = client.post("/slow", headers=slow_key)
    assert same.status_code == 409 and same.headers["retry-after"] == "1"
    assert same.json()["type"] == PROBLEM + "request-in-flight"
    assert results["slow"].status_code == 201 and results["quick"].status_code == 201, results["quick"].text
    assert replay.headers["idempotent-replayed"] == "true"
    assert calls == Counter(slow=1, quick=1)


# --- item 11: the record's connection in external-call mode, the caller's scope, tables gone ------------------------

@pytest.mark.parametrize("wiring", ["middleware", "route"])
def test_idem_connection_is_none_in_external_call_mode_instead_of_failing(database: Database, serve_app: Serve,
                                                                         wiring: str) -> None:
    seen: list[Any] = []

    def routes(router: Any) -> None:
        async def charge(conn: IdemConnection) -> Any:
            seen.append(conn)
            return {"charged": len(seen)}

        router.add_api_route("/charge", charge, methods=["POST"], status_code=201)

    with fastapi_served(database, serve_app, wiring, routes, policy(lease=timedelta(seconds=30))) as client:
        key = dict(HEADERS, **{"idempotency-key": '"charge-1"'})
        first = client.post("/charge", headers=key)
        again = client.post("/charge", headers=key)
    assert first.status_code == 201, first.text
    assert replayed(again) and again.content == first.content and seen == [None]


@pytest.mark.parametrize("wiring", ["middleware", "route"])
def test_the_layers_dependencies_run_on_the_event_loop(database: Database, serve_app: Serve, wiring: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`IdemConnection` and the route class's key-header dependency are `async def`: FastAPI sends a plain `def`
    dependency to its thread pool, a hop per request."""
    import fastapi.dependencies.utils

    pooled: list[str] = []
    to_pool = fastapi.dependencies.utils.run_in_threadpool

    async def recorded(call: Any, *args: Any, **kwargs: Any) -> Any:
        pooled.append(getattr(call, "__name__", repr(call)))
        return await to_pool(call, *args, **kwargs)

    monkeypatch.setattr(fastapi.dependencies.utils, "run_in_threadpool", recorded)
    seen: list[Any] = []

    def routes(router: Any) -> None:
        async def charge(conn: IdemConnection) -> Any:
            seen.append(conn)
            return {"charged": len(seen)}

        router.add_api_route("/charge", charge, methods=["POST"], status_code=201)

    with fastapi_served(database, serve_app, wiring, routes, policy()) as client:
        done = client.post("/charge", headers=dict(HEADERS, **{"idempotency-key": '"pool-1"'}))
    assert done.status_code == 201, done.text
    assert len(seen) == 1 and seen[0] is not None  # the record's connection (atomic mode)
    assert pooled == []


def test_the_asgi_middleware_leaves_the_callers_scope_as_it_was(database: Database, serve_app: Serve) -> None:
    if FastAPI is None:
        pytest.skip("the [http] extra (fastapi) is not installed")
    from idem_dialects.http.asgi import IdempotencyMiddleware

    store = idem_dialects.AsyncIdempotencyStore.from_url(database.async_url, table_prefix=database.prefix + "idem_")

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await store.engine.dispose()

    api = FastAPI(lifespan=lifespan)

    @api.post("/pay", status_code=201)
    async def pay() -> Any:
        return {"paid": True}

    idempotent = IdempotencyMiddleware(api, store=store, policy=policy())
    after: list[tuple[set[str], set[str]]] = []

    async def caller(scope: Any, receive: Any, send: Any) -> None:
        """The server's side of the middleware: what it handed over, it finds unchanged afterwards."""
        if scope["type"] != "http":
            return await idempotent(scope, receive, send)
        keys, state = set(scope), set(scope.get("state") or {})
        await idempotent(scope, receive, send)
        after.append((set(scope) - keys, set(scope.get("state") or {}) - state))

    with serve_app("asgi-middleware", caller) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/pay", headers=dict(HEADERS, **{"idempotency-key": '"scope-1"'})).status_code == 201
    assert after == [(set(), set())]


@pytest.mark.parametrize("stack", ["asgi-middleware", "flask-decorator"])
def test_tables_dropped_under_a_running_service_answer_503_not_500(database: Database, serve_app: Serve,
                                                                  stack: str) -> None:
    def fastapi_routes(router: Any) -> None:
        async def pay() -> Any:
            return {"paid": True}

        router.add_api_route("/pay", pay, methods=["POST"], status_code=201)

    def flask_routes(app: Any, decorate: Callable[[Any], Any]) -> None:
        app.post("/pay")(decorate(lambda: ({"paid": True}, 201)))

    served = (fastapi_served(database, serve_app, "middleware", fastapi_routes) if stack == "asgi-middleware"
              else flask_served(database, serve_app, "route", flask_routes))
    with served as client:
        assert client.post("/pay", headers=dict(HEADERS, **{"idempotency-key": '"before"'})).status_code == 201
        IdempotencyStore(database.sync, table_prefix=database.prefix + "idem_").drop_tables()
        gone = client.post("/pay", headers=dict(HEADERS, **{"idempotency-key": '"after"'}))
        IdempotencyStore(database.sync, table_prefix=database.prefix + "idem_").create_tables()  # for the teardown
    assert gone.status_code == 503, gone.text
    assert gone.headers["content-type"] == "application/problem+json" and gone.json()["status"] == 503
    assert int(gone.headers["retry-after"]) >= 1  # nothing is wrong with the request: it may come again
    assert "idem-dialects init" in gone.json()["detail"]


@pytest.mark.parametrize("stack", ["asgi-middleware", "flask-decorator"])
def test_a_blank_key_and_a_bare_comma_are_400_and_run_nothing(database: Database, serve_app: Serve,
                                                              stack: str) -> None:
    calls: Counter[str] = Counter()

    def fastapi_routes(router: Any) -> None:
        async def pay() -> Any:
            calls["pay"] += 1
            return {"paid": True}

        router.add_api_route("/pay", pay, methods=["POST"], status_code=201)

    def flask_routes(app: Any, decorate: Callable[[Any], Any]) -> None:
        @app.post("/pay")
        @decorate
        def pay() -> Any:
            calls["pay"] += 1
            return {"paid": True}, 201

    served = (fastapi_served(database, serve_app, "middleware", fastapi_routes) if stack == "asgi-middleware"
              else flask_served(database, serve_app, "route", flask_routes))
    with served as client:
        answers = [client.post("/pay", headers=dict(HEADERS, **{"idempotency-key": key}))
                   for key in ('" "', '"   "', ",", ",,", "k,", ",k")]
    for resp in answers:
        assert resp.status_code == 400 and resp.json()["type"] == PROBLEM + "invalid-key", resp.text
    assert calls["pay"] == 0 and database.count("idem_records") == 0

