"""Only what a retry should see is stored, and keys as clients send them: against every stack (Flask decorator and
WSGI middleware on werkzeug; ASGI middleware and FastAPI route class on uvicorn), on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

httpx = pytest.importorskip("httpx", reason="httpx (the [dev] extra) is not installed")
# `service` (conftest.Service) comes from tests/http/conftest.py.
Service = Any






MODES = pytest.mark.parametrize("mode", ["atomic", "lease"])
ROUTE = {("atomic", "throttled"): "/throttled", ("lease", "throttled"): "/external-throttled",
         ("atomic", "pay"): "/payments", ("lease", "pay"): "/external-pay",
         ("atomic", "validated"): "/validated", ("lease", "validated"): "/external-validated"}


@MODES
def test_a_handlers_429_is_not_replayed_the_retry_runs_it(service: Service, mode: str) -> None:
    path = ROUTE[mode, "throttled"]
    calls = path.strip("/")
    throttled = service.post(path, '"slow-1"')
    assert throttled.status_code == 429 and "idempotent-replayed" not in throttled.headers
    assert service.db.count("idem_records") == 0
    retried = service.post(path, '"slow-1"')
    assert retried.status_code == 201 and "idempotent-replayed" not in retried.headers
    assert service.calls[calls] == 2
    replay = service.post(path, '"slow-1"')
    assert replay.headers["idempotent-replayed"] == "true" and replay.content == retried.content
    assert service.calls[calls] == 2 and service.db.count("idem_records") == 1


@MODES
def test_a_trailing_slash_redirect_is_not_stored_and_the_followed_request_runs(service: Service, mode: str) -> None:
    path = ROUTE[mode, "pay"]
    calls = path.strip("/")
    headers = {"content-type": "application/json", "x-account": "acct-1", "idempotency-key": '"slash-1"'}
    first = service.client.post(path + "/", content=b'{"amount": 100}', headers=headers)
    # FastAPI answers 307 (redirect_slashes), Flask 404 (no such route): the framework's, not the handler's.
    assert first.status_code in (307, 404) and "idempotent-replayed" not in first.headers
    assert service.db.count("idem_records") == 0 and service.calls[calls] == 0
    followed = service.client.post(path + "/", content=b'{"amount": 100}', headers=headers, follow_redirects=True) \
        if first.status_code == 307 else service.client.post(path, content=b'{"amount": 100}', headers=headers)
    assert followed.status_code == 201 and "idempotent-replayed" not in followed.headers
    assert followed.history == [] or followed.history[0].status_code == 307
    assert service.calls[calls] == 1 and service.db.count("idem_records") == 1
    again = service.post(path, '"slash-1"')
    assert again.headers["idempotent-replayed"] == "true" and again.content == followed.content


@MODES
def test_a_validation_422_is_not_stored_and_the_corrected_body_gets_201(service: Service, mode: str) -> None:
    path = ROUTE[mode, "validated"]
    calls = path.strip("/")
    invalid = service.post(path, '"valid-1"', b'{"amount": "a lot"}')
    if invalid.status_code == 404:
        pytest.skip("Flask has no request validation of its own (the FastAPI stacks test this)")
    assert invalid.status_code == 422 and "idempotent-replayed" not in invalid.headers
    assert invalid.json()["detail"][0]["loc"] == ["body", "amount"]  # FastAPI's own, not request-mismatch
    assert service.db.count("idem_records") == 0 and service.calls[calls] == 0
    corrected = service.post(path, '"valid-1"', b'{"amount": 5}')
    assert corrected.status_code == 201 and "idempotent-replayed" not in corrected.headers
    assert service.calls[calls] == 1 and service.db.count("idem_records") == 1
    assert service.post(path, '"valid-1"', b'{"amount": 5}').headers["idempotent-replayed"] == "true"
    assert service.calls[calls] == 1


def test_an_oversize_response_after_an_external_call_is_stored_and_the_retry_does_not_run_it(service: Service
                                                                                               ) -> None:
    first = service.post("/external-big", '"big-ext-1"')
    doc = service.problem(first, "response-too-large", 500)
    assert "carried out" in doc["detail"] and service.calls["external-big"] == 1
    retry = service.post("/external-big", '"big-ext-1"')
    assert retry.status_code == 500 and retry.headers["idempotent-replayed"] == "true"
    assert retry.content == first.content
    assert service.calls["external-big"] == 1 and service.db.count("idem_records") == 1


def test_a_bare_uuid_starting_with_a_digit_and_its_quoted_form_are_one_key(service: Service) -> None:
    key = "8" + str(uuid.uuid4())[1:]  # a digit first, as 10 of 16 UUIDs are
    bare = service.post("/payments", key)
    assert bare.status_code == 201 and "idempotent-replayed" not in bare.headers
    quoted = service.post("/payments", f'"{key}"')
    assert quoted.status_code == 201 and quoted.headers["idempotent-replayed"] == "true"
    assert quoted.content == bare.content
    assert service.calls["payments"] == 1 and service.db.count("payments") == 1
    too_long = service.post("/payments", "k" * 256)
    service.problem(too_long, "invalid-key", 400)
