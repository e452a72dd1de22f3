"""The issue's Must-show points, each against every stack (Flask decorator and WSGI middleware on a threaded
werkzeug server; ASGI middleware and FastAPI route class on uvicorn) on SQLite and PostgreSQL, through httpx."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

import idem_dialects

httpx = pytest.importorskip("httpx", reason="httpx (the [dev] extra) is not installed")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# `service` (conftest.Service) and `database` (conftest.Database) come from tests/http/conftest.py.
Service = Database = Any


def test_missing_key_is_400_and_nothing_runs(service: Service) -> None:
    service.problem(service.post("/payments", None), "missing-key", 400)
    service.problem(service.post("/payments", "two words"), "invalid-key", 400)
    service.problem(service.post("/payments", '""'), "invalid-key", 400)  # the store's key rules (InvalidKey)
    service.problem(service.post("/payments", '"' + "k" * 256 + '"'), "invalid-key", 400)
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
    service.problem(service.post("/payments", '"pay-2"', b'{"amount": 101}'), "request-mismatch", 422)
    assert service.calls["payments"] == 1 and service.db.count("payments") == 1


def test_same_key_under_two_scopes_runs_twice(service: Service) -> None:
    a = service.post("/payments", '"shared"', account="acct-1")
    b = service.post("/payments", '"shared"', account="acct-2")
    assert a.status_code == b.status_code == 201 and "idempotent-replayed" not in b.headers
    assert a.json()["id"] != b.json()["id"]
    assert service.db.count("payments") == 2 and service.db.count("idem_records") == 2


def test_concurrent_duplicate_in_external_call_mode_is_409_with_retry_after(service: Service) -> None:
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(service.post("/external", '"ext-1"')))
    first.start()
    assert service.started.wait(30)
    duplicate = service.post("/external", '"ext-1"')  # while the first is inside its external call
    service.problem(duplicate, "request-in-flight", 409)
    assert int(duplicate.headers["retry-after"]) >= 1
    service.gate.set()
    first.join(30)
    assert results[0].status_code == 201
    replay = service.post("/external", '"ext-1"')
    assert replay.content == results[0].content and replay.headers["idempotent-replayed"] == "true"
    assert service.calls["external"] == 1


def test_concurrent_duplicate_in_atomic_mode_waits_then_replays(service: Service) -> None:
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(service.post("/gated", '"atomic-1"')))
    first.start()
    assert service.started.wait(30)  # the first holds its claim, uncommitted, inside the handler
    second = threading.Thread(target=lambda: results.append(service.post("/gated", '"atomic-1"')))
    second.start()
    service.gate.set()
    first.join(30)
    second.join(30)
    assert sorted(r.status_code for r in results) == [201, 201]
    assert results[0].content == results[1].content
    assert sorted(r.headers.get("idempotent-replayed", "") for r in results) == ["", "true"]
    assert service.calls["gated"] == 1 and service.db.count("payments") == 1


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


def test_bodies_over_the_limits_are_refused_and_leave_nothing(service: Service) -> None:
    huge = b'{"amount": 1, "pad": "' + b"x" * service.limit + b'"}'
    service.problem(service.post("/payments", '"huge-request"', huge), "request-too-large", 413)
    big = service.problem(service.post("/big", '"huge-response"'), "response-too-large", 500)
    assert service.calls["payments"] == 0
    # The response's write rolled back; the problem is kept for its key: a retry gets it and runs nothing.
    assert service.db.count("payments") == 0 and service.db.count("idem_records") == 1
    again = service.post("/big", '"huge-response"')
    assert again.headers["idempotent-replayed"] == "true" and again.json() == big
    assert service.db.count("payments") == 0 and service.db.count("idem_records") == 1


def post_thrice(url: str) -> str:
    """The README's quick start: the same payment twice (a replay) and the key reused for another; its Location."""
    with httpx.Client(base_url=url, timeout=30) as client:
        headers = {"x-account": "1", "idempotency-key": '"pay-42"'}
        first = client.post("/payments", json={"amount": 100}, headers=headers)
        again = client.post("/payments", json={"amount": 100}, headers=headers)
        other = client.post("/payments", json={"amount": 7}, headers=headers)
    assert first.status_code == again.status_code == 201 and other.status_code == 422
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
    assert again.headers["location"] == first.headers["location"]
    return str(first.headers["location"])


def test_flask_example_on_sqlite(tmp_path: Path, load_example: Callable[[str], Any],
                                 serve_app: Callable[[str, Any], AbstractContextManager[str]]) -> None:
    app = load_example("flask_sqlite").create_app(f"sqlite:///{tmp_path / 'example.db'}")
    with serve_app("flask-decorator", app) as url:
        assert post_thrice(url) == "/payments/1"


def test_fastapi_example_on_postgresql_in_at_most_10_lines(database: Database, load_example: Callable[[str], Any],
                                                            serve_app: Callable[[str, Any], AbstractContextManager[str]]
                                                            ) -> None:
    lines = [line for line in (EXAMPLES / "fastapi_postgres.py").read_text().splitlines() if line.endswith("# idem")]
    assert 0 < len(lines) <= 10
    if database.engine_name != "postgresql":
        pytest.skip("the FastAPI example is the PostgreSQL one (SQLite is the Flask example's)")
    if not hasattr(idem_dialects, "AsyncIdempotencyStore"):
        pytest.skip("idem_dialects.AsyncIdempotencyStore is not in this build (the async store, issue 14)")
    app = load_example("fastapi_postgres").create_app(database.async_url, table_prefix=database.prefix)
    with serve_app("fastapi-route", app) as url:
        post_thrice(url)
    assert database.count("payments") == 1
