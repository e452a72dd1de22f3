"""The WSGI side against a real threaded WSGI server (werkzeug) through a real HTTP client (httpx), on SQLite.

Every test runs twice: the Flask view decorator, and the WSGI middleware wrapped around the same Flask app.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

flask = pytest.importorskip("flask", reason="the [http] extra (flask) is not installed")
httpx = pytest.importorskip("httpx", reason="the [http] extra (httpx) is not installed")
serving = pytest.importorskip("werkzeug.serving", reason="the [http] extra (werkzeug) is not installed")

from sqlalchemy import text  # noqa: E402

from idem_dialects import IdempotencyStore  # noqa: E402
from idem_dialects.http import IdempotencyPolicy, current_connection  # noqa: E402
from idem_dialects.http.flask import idempotent_view  # noqa: E402
from idem_dialects.http.wsgi import IdempotencyMiddleware  # noqa: E402

PROBLEM = "urn:idem-dialects:problem:"
LIMIT = 64 * 1024
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> Any:
    """Import examples/<name>.py as README shows it (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Service:
    client: httpx.Client
    store: IdempotencyStore
    calls: Counter[str]
    started: threading.Event
    gate: threading.Event

    def count(self, table: str) -> int:
        with self.store.engine.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())

    def post(self, path: str, key: str | None, body: bytes | str = b'{"amount": 100}', account: str = "acct-1",
             **headers: str) -> httpx.Response:
        hdrs = {"content-type": "application/json", "x-account": account, **headers}
        if key is not None:
            hdrs["idempotency-key"] = key
        return self.client.post(path, content=body, headers=hdrs)


def build_app(store: IdempotencyStore, form: str, calls: Counter[str], started: threading.Event,
              gate: threading.Event) -> Any:
    atomic = IdempotencyPolicy(scope=lambda r: r.header("x-account"), paths=lambda p: p != "/external",
                               max_request_bytes=LIMIT, max_response_bytes=LIMIT)
    external = IdempotencyPolicy(scope=lambda r: r.header("x-account"), paths={"/external"},
                                 lease=timedelta(seconds=30))
    app = flask.Flask("wsgi-test")

    def deco(policy: IdempotencyPolicy) -> Callable[[Any], Any]:
        return idempotent_view(store, policy) if form == "decorator" else (lambda view: view)

    def write(amount: int) -> int:
        return int(current_connection().execute(
            text("INSERT INTO payments (account, amount) VALUES (:a, :m) RETURNING id"),
            {"a": flask.request.headers["x-account"], "m": amount}).scalar_one())

    @app.post("/payments")
    @deco(atomic)
    def payments() -> Any:
        calls["payments"] += 1
        pid = write(flask.request.get_json()["amount"])
        return {"id": pid, "note": "café ✓"}, 201, {"Location": f"/payments/{pid}", "X-Trace": str(calls["payments"])}

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
        calls["flaky"] += 1
        pid = write(5)
        if calls["flaky"] == 1:
            return {"error": "upstream down"}, 503
        return {"id": pid}, 201

    @app.post("/external")
    @deco(external)
    def external_call() -> Any:
        calls["external"] += 1
        started.set()
        assert gate.wait(30)
        return {"charged": calls["external"]}, 201

    if form == "middleware":
        app.wsgi_app = IdempotencyMiddleware(IdempotencyMiddleware(app.wsgi_app, store, external), store, atomic)
    return app


@pytest.fixture(params=["decorator", "middleware"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'http.db'}")
    store.create_tables()
    with store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE payments (id INTEGER PRIMARY KEY, account TEXT NOT NULL, amount INTEGER)"))
    calls: Counter[str] = Counter()
    started, gate = threading.Event(), threading.Event()
    server = serving.make_server("127.0.0.1", 0, build_app(store, request.param, calls, started, gate),
                                 threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}", timeout=30) as client:
            yield Service(client, store, calls, started, gate)
    finally:
        gate.set()
        server.shutdown()
        thread.join(10)
        store.close()


def problem_of(resp: httpx.Response, slug: str, status: int) -> dict[str, Any]:
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/problem+json"
    doc: dict[str, Any] = resp.json()
    assert doc["type"] == PROBLEM + slug and doc["status"] == status
    return doc


def test_missing_key_is_400_and_nothing_runs(service: Service) -> None:
    problem_of(service.post("/payments", None), "missing-key", 400)
    problem_of(service.post("/payments", "unquoted-key"), "invalid-key", 400)
    assert service.calls["payments"] == 0 and service.count("payments") == 0


def test_replay_returns_status_body_bytes_allowed_headers_and_marker(service: Service) -> None:
    first = service.post("/payments", '"pay-1"', b'{"amount": 100, "currency": "EUR"}')
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    # The same request with its keys reordered and other whitespace is the same request (RFC 8785).
    again = service.post("/payments", '"pay-1"', b'{ "currency":"EUR",\n "amount":100 }')
    assert again.status_code == 201
    assert again.content == first.content
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["content-type"] == first.headers["content-type"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "x-trace" not in again.headers  # not on the allow-list
    assert service.calls["payments"] == 1 and service.count("payments") == 1


def test_reuse_with_another_body_is_422(service: Service) -> None:
    assert service.post("/payments", '"pay-2"', b'{"amount": 100}').status_code == 201
    problem_of(service.post("/payments", '"pay-2"', b'{"amount": 101}'), "request-mismatch", 422)
    assert service.calls["payments"] == 1 and service.count("payments") == 1


def test_same_key_under_two_scopes_runs_twice(service: Service) -> None:
    a = service.post("/payments", '"shared"', account="acct-1")
    b = service.post("/payments", '"shared"', account="acct-2")
    assert a.status_code == b.status_code == 201 and "idempotent-replayed" not in b.headers
    assert a.json()["id"] != b.json()["id"]
    assert service.count("payments") == 2 and service.count("idem_records") == 2


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
    assert service.count("payments") == 0 and service.count("idem_records") == 0


def test_5xx_is_not_stored_and_the_retry_runs(service: Service) -> None:
    failed = service.post("/flaky", '"flaky-1"')
    assert failed.status_code == 503 and "idempotent-replayed" not in failed.headers
    assert service.count("payments") == 0 and service.count("idem_records") == 0
    retried = service.post("/flaky", '"flaky-1"')
    assert retried.status_code == 201 and service.calls["flaky"] == 2
    assert service.count("payments") == 1 and service.count("idem_records") == 1
    assert service.post("/flaky", '"flaky-1"').headers["idempotent-replayed"] == "true"
    assert service.calls["flaky"] == 2


def test_flask_example_runs_once_per_key(tmp_path: Path) -> None:
    app = load_example("flask_sqlite").create_app(f"sqlite:///{tmp_path / 'example.db'}")
    server = serving.make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}") as client:
            headers = {"x-account": "1", "idempotency-key": '"pay-42"'}
            first = client.post("/payments", json={"amount": 100}, headers=headers)
            again = client.post("/payments", json={"amount": 100}, headers=headers)
    finally:
        server.shutdown()
        thread.join(10)
    assert first.status_code == again.status_code == 201
    assert json.loads(again.content) == json.loads(first.content) and again.content == first.content
    assert again.headers["idempotent-replayed"] == "true" and again.headers["location"] == "/payments/1"


def test_bodies_over_the_limits_are_refused_and_leave_nothing(service: Service) -> None:
    problem_of(service.post("/payments", '"huge-request"', b'{"amount": 1, "pad": "' + b"x" * LIMIT + b'"}'),
               "request-too-large", 413)
    problem_of(service.post("/big", '"huge-response"'), "response-too-large", 500)
    assert service.calls["payments"] == 0
    assert service.count("payments") == 0 and service.count("idem_records") == 0
