"""Duplicates while the first request runs, over real servers. External-call mode: a handler that outlives its lease
keeps its claim (the lease is renewed while it runs), so a retry meanwhile gets 409 with Retry-After and the handler
runs once. Atomic mode with on_in_flight="conflict": the duplicate gets 409 with Retry-After at once instead of
waiting on the first request's uncommitted claim. Flask (decorator, WSGI middleware)
on werkzeug with the sync store; Starlette's ASGI middleware and FastAPI's route class on uvicorn with the async store;
SQLite and PostgreSQL (the `database` fixture)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import pytest

import idem_dialects
from idem_dialects import IdempotencyStore
from idem_dialects.http import IdempotencyPolicy

httpx = pytest.importorskip("httpx", reason="httpx (the [dev] extra) is not installed")

PROBLEM = "https://idem-dialects.readthedocs.io/en/latest/http.html#"
Database = Any  # tests/http/conftest.py's, given by its `database` fixture
STACKS = ["flask-decorator", "wsgi-middleware", "asgi-middleware", "fastapi-route"]
# Renewed every third of it: a renewal would have to be a second late for the claim to lapse on a loaded machine.
LEASE = timedelta(seconds=1.5)
# The client, the handlers' calls, a handler's start, the gate holding /charge and /hold open.
Served = tuple[Any, Counter[str], threading.Event, threading.Event]


def policy() -> IdempotencyPolicy:
    return IdempotencyPolicy(scope=lambda r: r.header("x-account"), paths={"/charge"}, lease=LEASE)


def conflict_policy() -> IdempotencyPolicy:
    return IdempotencyPolicy(scope=lambda r: r.header("x-account"), paths={"/hold"}, on_in_flight="conflict")


def flask_app(db: Database, form: str, calls: Counter[str], started: threading.Event,
              gate: threading.Event) -> tuple[Any, Callable[[], Any]]:
    flask = pytest.importorskip("flask", reason="the [flask] extra is not installed")
    from idem_dialects.http.flask import idempotent_view
    from idem_dialects.http.wsgi import IdempotencyMiddleware

    store = IdempotencyStore.from_url(db.sync_url, table_prefix=db.prefix + "idem_")
    app = flask.Flask("lease-renewal")
    deco = idempotent_view(store, policy()) if form == "flask-decorator" else (lambda view: view)

    @app.post("/charge")
    @deco
    def charge() -> Any:
        calls["charge"] += 1
        started.set()
        assert gate.wait(60)  # the external call, until the test has the retry's answer
        return {"charged": calls["charge"]}, 201

    @app.post("/hold")
    @(idempotent_view(store, conflict_policy()) if form == "flask-decorator" else (lambda view: view))
    def hold() -> Any:
        calls["hold"] += 1
        started.set()
        assert gate.wait(30)  # the record's transaction open until the test has the duplicate's answer
        return {"held": calls["hold"]}, 201

    if form == "wsgi-middleware":
        app.wsgi_app = IdempotencyMiddleware(  # type: ignore[method-assign]
            IdempotencyMiddleware(app.wsgi_app, store, policy()), store, conflict_policy())
    return app, store.close


def asgi_app(db: Database, form: str, calls: Counter[str], started: threading.Event,
             gate: threading.Event) -> tuple[Any, Callable[[], Any]]:
    fastapi = pytest.importorskip("fastapi", reason="the [fastapi] extra is not installed")
    from idem_dialects.http.asgi import IdempotencyMiddleware
    from idem_dialects.http.fastapi import idempotent_route

    store = idem_dialects.AsyncIdempotencyStore.from_url(db.async_url, table_prefix=db.prefix + "idem_")
    app = fastapi.FastAPI()
    routed = form == "fastapi-route"
    router = fastapi.APIRouter(**({"route_class": idempotent_route(store, policy())} if routed else {}))
    held = fastapi.APIRouter(**({"route_class": idempotent_route(store, conflict_policy())} if routed else {}))

    @held.post("/hold", status_code=201)
    async def hold() -> Any:
        calls["hold"] += 1
        started.set()
        while not gate.is_set():  # the record's transaction open until the test has the duplicate's answer
            await asyncio.sleep(0.01)
        return {"held": calls["hold"]}

    @router.post("/charge", status_code=201)
    async def charge() -> Any:
        calls["charge"] += 1
        started.set()
        while not gate.is_set():  # the external call, until the test has the retry's answer
            await asyncio.sleep(0.01)
        return {"charged": calls["charge"]}

    app.include_router(router)
    app.include_router(held)
    if not routed:
        app.add_middleware(IdempotencyMiddleware, store=store, policy=policy())
        app.add_middleware(IdempotencyMiddleware, store=store, policy=conflict_policy())
    return app, lambda: None


@pytest.fixture(params=STACKS)
def served(request: pytest.FixtureRequest, database: Database,
           serve_app: Callable[[str, Any], AbstractContextManager[str]]) -> Iterator[Served]:
    stack: str = request.param
    calls: Counter[str] = Counter()
    started, gate = threading.Event(), threading.Event()
    build = flask_app if stack in ("flask-decorator", "wsgi-middleware") else asgi_app
    app, close = build(database, stack, calls, started, gate)
    try:
        with serve_app(stack, app) as url, httpx.Client(base_url=url, timeout=30) as client:
            yield client, calls, started, gate
    finally:
        gate.set()
        close()


def test_handler_outliving_its_lease_runs_once_and_the_retry_gets_409(
        served: Served, database: Database) -> None:
    client, calls, started, gate = served
    headers = {"content-type": "application/json", "x-account": "acct-1", "idempotency-key": '"lease-1"'}
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(client.post("/charge", json={"a": 1}, headers=headers)))
    first.start()
    try:
        assert started.wait(30)
        time.sleep(LEASE.total_seconds() + 0.3)  # the lease is over: without renewal the claim would be taken over
        retry = client.post("/charge", json={"a": 1}, headers=headers)  # the handler still runs: the gate is shut
    finally:
        gate.set()
    assert retry.status_code == 409, retry.text
    assert retry.json()["type"] == PROBLEM + "request-in-flight"
    assert int(retry.headers["retry-after"]) >= 1
    first.join(30)
    assert results[0].status_code == 201 and results[0].json() == {"charged": 1}
    replay = client.post("/charge", json={"a": 1}, headers=headers)
    assert replay.status_code == 201 and replay.content == results[0].content
    assert replay.headers["idempotent-replayed"] == "true"
    assert calls["charge"] == 1
    assert database.count("idem_records") == 1


def test_conflict_option_answers_a_concurrent_duplicate_409_at_once(served: Served, database: Database) -> None:
    client, calls, started, gate = served
    headers = {"content-type": "application/json", "x-account": "acct-1", "idempotency-key": '"hold-1"'}
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(client.post("/hold", json={"a": 1}, headers=headers)))
    first.start()
    try:
        assert started.wait(30)
        duplicate = client.post("/hold", json={"a": 1}, headers=headers)  # the first's claim is not committed
    finally:
        gate.set()
        first.join(30)
    assert duplicate.status_code == 409, duplicate.text
    assert duplicate.json()["type"] == PROBLEM + "request-in-flight"
    assert int(duplicate.headers["retry-after"]) >= 1
    assert results[0].status_code == 201 and results[0].json() == {"held": 1}
    replay = client.post("/hold", json={"a": 1}, headers=headers)
    assert replay.content == results[0].content and replay.headers["idempotent-replayed"] == "true"
    assert calls["hold"] == 1 and database.count("idem_records") == 1
