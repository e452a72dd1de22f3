"""A response under the policy's `max_response_bytes` but over what MariaDB takes in one statement
(`max_allowed_packet`), issue 47: the completion is refused for its size, and that is final for the key. The key
completes with the `response-too-large` problem and no retry runs the handler again, in atomic mode (its writes
rolled back) and in lease mode past the lease; and the same when the server's limit is lowered after the store
started (each new session's limit is read). FastAPI on asyncmy and Flask on PyMySQL against a private MariaDB server
(its global limit is changed freely: `private_mariadb` and `packet`, tests/mariadb_packet_common.py). Django in
tests/djangotests/test_django_limits.py: the limit from the start on the machine's MariaDB, and the limit lowered
after the store started on a private server of its own, through the same fixtures."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

import pytest
from mariadb_packet_common import *  # noqa: F403  (fixtures: packet, private_mariadb)
from mariadb_packet_common import BODY, HIGH, LOW
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

import idem_dialects
from idem_dialects import IdempotencyStore, RetryPolicy
from idem_dialects.http import IdempotencyPolicy, current_connection

httpx = pytest.importorskip("httpx", reason="the [http] extra (httpx) is not installed")
try:  # at module level: FastAPI resolves the endpoints' (string) annotations in this module's globals
    from fastapi import Request
except ImportError:  # the FastAPI stack skips with the reason
    Request = None
Serve = Callable[[str, Any], AbstractContextManager[str]]
PROBLEM = "https://idem-dialects.readthedocs.io/en/latest/http.html#response-too-large"
LEASE = timedelta(seconds=1)
RETRY = RetryPolicy(total=5)  # a failure retried (main before issue 47) ends within seconds, not 30


@pytest.fixture
def payments(private_mariadb: URL) -> None:
    """The handlers' table on the private server, empty."""
    engine = create_engine(private_mariadb, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS payments (id INTEGER AUTO_INCREMENT PRIMARY KEY,"
                                 " amount INTEGER)")
            conn.exec_driver_sql("DELETE FROM payments")
    finally:
        engine.dispose()


def rows(url: URL) -> int:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM payments")).scalar_one())
    finally:
        engine.dispose()


def policy(mode: str) -> IdempotencyPolicy:
    return IdempotencyPolicy(scope=lambda r: r.header("x-account"), max_response_bytes=4 * BODY,
                             lease=LEASE if mode == "lease" else None)


@contextmanager
def fastapi_served(url: URL, serve: Serve, mode: str, calls: Counter[str], prefix: str) -> Iterator[Any]:
    fastapi = pytest.importorskip("fastapi", reason="the [fastapi] extra is not installed")
    pytest.importorskip("asyncmy", reason="asyncmy is not installed")
    from idem_dialects.http.fastapi import idempotent_route

    # NullPool: every transaction on a new session, as after a failover (each new session's limit is read).
    store = idem_dialects.AsyncIdempotencyStore.from_url(url.set(drivername="mariadb+asyncmy"), table_prefix=prefix,
                                                         retry=RETRY, poolclass=NullPool)

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await store.create_tables()
        yield
        await store.drop_tables()
        await store.engine.dispose()

    app = fastapi.FastAPI(lifespan=lifespan)
    router = fastapi.APIRouter(route_class=idempotent_route(store, policy(mode)))

    async def big(request: Request) -> Any:
        calls["big"] += 1
        conn = current_connection(required=False)
        if conn is not None:  # atomic mode: a write that must roll back with the claim
            await conn.execute(text("INSERT INTO payments (amount) VALUES (1)"))
        return fastapi.Response(b"x" * int(request.query_params.get("size", BODY)), status_code=201)

    router.add_api_route("/big", big, methods=["POST"])
    app.include_router(router)
    with serve("asgi-middleware", app) as base, httpx.Client(base_url=base, timeout=60) as client:
        yield client


@contextmanager
def flask_served(url: URL, serve: Serve, mode: str, calls: Counter[str], prefix: str) -> Iterator[Any]:
    flask = pytest.importorskip("flask", reason="the [flask] extra is not installed")
    from idem_dialects.http.flask import idempotent_view

    store = IdempotencyStore.from_url(url.set(drivername="mariadb+pymysql"), table_prefix=prefix, retry=RETRY,
                                      poolclass=NullPool)
    store.create_tables()
    app = flask.Flask("limits")

    @app.post("/big")
    @idempotent_view(store, policy(mode))
    def big() -> Any:
        calls["big"] += 1
        conn = current_connection(required=False)
        if conn is not None:
            conn.execute(text("INSERT INTO payments (amount) VALUES (1)"))
        return b"x" * int(flask.request.args.get("size", BODY)), 201

    try:
        with serve("flask-decorator", app) as base, httpx.Client(base_url=base, timeout=60) as client:
            yield client
    finally:
        store.drop_tables()
        store.close()


STACKS = {"fastapi-asyncmy": fastapi_served, "flask-pymysql": flask_served}


def too_large(resp: Any) -> None:
    assert resp.status_code == 500, resp.text[:300]
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.json()["type"] == PROBLEM


@pytest.mark.parametrize("mode", ["atomic", "lease"])
@pytest.mark.parametrize("lowered", [False, True], ids=["limit-from-the-start", "limit-lowered-later"])
@pytest.mark.parametrize("stack", list(STACKS))
def test_a_response_over_the_servers_limit_runs_the_handler_once_and_every_retry_gets_the_problem(
        private_mariadb: URL, packet: Callable[[int], None], payments: None, serve_app: Serve, stack: str, mode: str,
        lowered: bool) -> None:
    calls: Counter[str] = Counter()
    packet(HIGH if lowered else LOW)
    headers = {"x-account": "a1", "idempotency-key": f'"big-{stack}-{mode}-{lowered}"'}
    with STACKS[stack](private_mariadb, serve_app, mode, calls, f"lim{mode[0]}{int(lowered)}_") as client:
        if lowered:  # the store has started and read the server's limit: a small response completes
            small = client.post("/big?size=1024", headers={**headers, "idempotency-key": '"small"'})
            assert small.status_code == 201 and calls["big"] == 1
            calls.clear()
            packet(LOW)  # then a failover to a server configured lower, say
        first = client.post("/big", headers=headers)
        too_large(first)
        if mode == "lease":
            time.sleep(LEASE.total_seconds() * 1.5)  # past the lease: a claim left in flight would be taken over
        again = client.post("/big", headers=headers)
    too_large(again)
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert calls["big"] == 1
    if mode == "atomic":
        assert rows(private_mariadb) == (1 if lowered else 0)  # the small response's write only
