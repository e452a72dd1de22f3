"""The Django integration's Must-show points against a live server (Django's threaded LiveServer), on SQLite,
PostgreSQL and MariaDB: DRF views writing ORM rows, the record in their transaction."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django_common import Site, new_key

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")
PROBLEM = "https://idem-dialects.readthedocs.io/en/latest/http.html#"


def calls(site: Site, view: str, key: str) -> int:
    from django_site.views import CALLS

    return CALLS[f"{site.alias}:{view}:{key}"]


def test_first_call_201_retry_replays_with_marker_and_no_second_row(site: Site) -> None:
    key = new_key()
    first = site.post("payments", key)
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    again = site.post("payments", key)
    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content  # byte for byte
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["content-type"] == first.headers["content-type"]
    assert "x-trace" not in again.headers  # not on the replay allow-list
    assert calls(site, "payments", key) == 1
    assert site.rows() == 1 and site.records(key) == 1


def test_a_view_decorated_outside_the_policys_paths_replays_and_runs_once(site: Site) -> None:
    """settings.IDEMPOTENCY's POLICY selects only /mw/ for the middleware; the decorated views are elsewhere, and
    explicit decoration wins over those paths (the decorator applies the policy's methods only)."""
    from django.conf import settings

    from idem_dialects.django.conf import get_config

    assert not get_config().make_policy().applies("POST", f"/{site.alias}/function")
    assert settings.IDEMPOTENCY["POLICY"]["paths"]("/mw/payments")
    key, account = new_key(), {"X-Account": "acct-paths"}
    first = site.post("function", key, headers=account)
    again = site.post("function", key, headers=account)
    assert first.status_code == again.status_code == 201, first.text
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert calls(site, "function", key) == 1 and site.rows("acct-paths") == 1 and site.records(key) == 1


def test_a_different_body_is_422(site: Site) -> None:
    key = new_key()
    assert site.post("payments", key, {"amount": 100}).status_code == 201
    mismatch = site.post("payments", key, {"amount": 101})
    assert mismatch.status_code == 422
    assert mismatch.headers["content-type"] == "application/problem+json"
    assert mismatch.json()["type"] == PROBLEM + "request-mismatch"
    assert site.rows() == 1 and calls(site, "payments", key) == 1


def test_view_raising_after_its_write_leaves_no_row_no_record_and_the_retry_runs_once(site: Site) -> None:
    key = new_key()
    failed = site.post("explode", key)
    assert failed.status_code == 500
    assert site.rows() == 0 and site.records(key) == 0  # the ORM row and the claim rolled back together
    retried = site.post("explode", key)
    assert retried.status_code == 201 and "idempotent-replayed" not in retried.headers
    assert calls(site, "explode", key) == 2  # the failed attempt and the retry: the retry ran the view once
    replay = site.post("explode", key)
    assert replay.headers["idempotent-replayed"] == "true" and calls(site, "explode", key) == 2
    assert site.rows() == 1 and site.records(key) == 1


@pytest.mark.parametrize("round_", range(3))
def test_16_concurrent_requests_with_one_key_make_one_row(site: Site, round_: int) -> None:
    key = new_key()
    barrier = threading.Barrier(16)
    answers: list[Any] = []
    lock = threading.Lock()

    def one() -> None:
        with site.client() as client:
            barrier.wait()
            resp = client.post(f"/{site.alias}/payments", json={"amount": 100},
                               headers={"Idempotency-Key": f'"{key}"', "X-Slow": "0.2"})
        with lock:
            answers.append(resp)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(answers) == 16
    assert sorted(a.status_code for a in answers) == [201] * 16, [a.text for a in answers if a.status_code != 201]
    assert sum("idempotent-replayed" not in a.headers for a in answers) == 1
    assert len({a.content for a in answers}) == 1
    assert site.rows() == 1 and site.records(key) == 1 and calls(site, "payments", key) == 1


def test_scope_from_request_user_two_users_same_key_own_results(site: Site) -> None:
    key = new_key()
    alice = site.post("payments", key, user="alice")
    bob = site.post("payments", key, user="bob")
    assert alice.status_code == bob.status_code == 201
    assert "idempotent-replayed" not in bob.headers
    assert alice.json()["account"] == "alice" and bob.json()["account"] == "bob"
    assert alice.json()["id"] != bob.json()["id"]
    assert site.post("payments", key, user="bob").json() == bob.json()  # each replays their own
    assert site.post("payments", key, user="alice").json() == alice.json()
    assert site.rows("alice") == 1 and site.rows("bob") == 1 and site.records(key) == 2


def test_anonymous_request_is_401_problem_and_nothing_runs(site: Site) -> None:
    key = new_key()
    resp = site.post("function", key)  # the function view's scope is X-Account, absent here
    assert resp.status_code == 401 and resp.json()["type"] == PROBLEM + "unauthenticated"
    assert site.rows() == 0 and calls(site, "function", key) == 0


@pytest.mark.parametrize("view", ["viewset", "api_view", "function", "class"])
def test_every_view_form_replays_once(site: Site, view: str) -> None:
    key = new_key()
    headers = {"X-Account": "acct-1"}
    first = site.post(view, key, headers=headers)
    assert first.status_code == 201, first.text
    again = site.post(view, key, headers=headers)
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert calls(site, view, key) == 1 and site.rows() == 1


def test_external_call_mode_commits_the_claim_first_and_replays(site: Site) -> None:
    key = new_key()
    first = site.post("external", key)
    assert first.status_code == 201
    again = site.post("external", key)
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert calls(site, "external", key) == 1 and site.rows() == 1 and site.records(key) == 1


def test_missing_key_is_400_and_the_view_does_not_run(site: Site) -> None:
    resp = site.post("payments", None)
    assert resp.status_code == 400 and resp.json()["type"] == PROBLEM + "missing-key"
    assert site.rows() == 0


def test_external_call_mode_duplicate_while_the_view_runs_is_409_with_retry_after(site: Site) -> None:
    from django_site.views import GATE, STARTED

    STARTED.clear()
    GATE.clear()
    key = new_key()
    first: list[Any] = []
    thread = threading.Thread(target=lambda: first.append(site.post("gated", key)))
    thread.start()
    try:
        assert STARTED.wait(30)
        duplicate = site.post("gated", key)
        assert duplicate.status_code == 409 and duplicate.json()["type"] == PROBLEM + "request-in-flight"
        assert int(duplicate.headers["retry-after"]) >= 1
    finally:
        GATE.set()
        thread.join(60)
    assert first[0].status_code == 201
    assert site.post("gated", key).headers["idempotent-replayed"] == "true" and calls(site, "gated", key) == 1


@pytest.fixture
def atomic_requests(site: Site) -> Any:
    """ATOMIC_REQUESTS on the site's alias: Django wraps each view in its own atomic block (the decorator's block is
    a savepoint inside it; the middleware's encloses it)."""
    from django.db import connections

    settings_dict = connections.settings[site.alias]
    settings_dict["ATOMIC_REQUESTS"] = True
    yield site
    settings_dict["ATOMIC_REQUESTS"] = False


def test_with_atomic_requests_a_raising_view_still_leaves_neither_row_nor_record(atomic_requests: Site) -> None:
    site, key = atomic_requests, new_key()
    assert site.post("explode", key).status_code == 500
    assert site.rows() == 0 and site.records(key) == 0
    first = site.post("explode", key)
    assert first.status_code == 201
    again = site.post("explode", key)
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert site.rows() == 1 and site.records(key) == 1


def test_a_decorated_view_serves_methods_outside_the_policy_without_a_key_and_never_stores_them(site: Site) -> None:
    """GET, HEAD, OPTIONS, PUT and DELETE are not the policy's methods: the view runs for them as if undecorated,
    with or without a key, and nothing is stored or replayed (a stored GET would replay a stale read)."""
    account = {"X-Account": "acct-1"}
    path = f"/{site.alias}/ledger"
    with site.client(None) as client:
        for method in ("GET", "HEAD", "OPTIONS", "PUT", "DELETE"):
            read = client.request(method, path, headers=account)
            assert read.status_code == 200, (method, read.text)
            assert calls(site, f"ledger-{method}", "") == 1
        key = new_key()
        keyed = dict(account, **{"Idempotency-Key": f'"{key}"'})
        first = client.get(path, headers=keyed)
        assert site.post("ledger", key, headers=account).status_code == 201
        again = client.get(path, headers=keyed)
    assert first.json() == {"payments": 0} and again.json() == {"payments": 1}  # read anew, not replayed
    assert "idempotent-replayed" not in again.headers and calls(site, "ledger-GET", key) == 2
    assert site.records(key) == 1  # the POST's only
    assert site.post("ledger", None, headers=account).status_code == 400  # POST still requires its key


@pytest.mark.parametrize("view", ["refuse", "missing"])
def test_an_http_exception_a_decorated_view_raises_rolls_its_write_back_and_is_stored_once(site: Site,
                                                                                            view: str) -> None:
    """Django's PermissionDenied and DRF's NotFound, each raised after a write, are answered as Django and DRF answer
    them: the write rolls back, the answer is stored in a transaction of its own, and the retry replays it."""
    key, account = new_key(), {"X-Account": "acct-1"}
    first = site.post(view, key, headers=account)
    again = site.post(view, key, headers=account)
    status = 403 if view == "refuse" else 404
    assert first.status_code == again.status_code == status, first.text
    assert "idempotent-replayed" not in first.headers and again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content and calls(site, view, key) == 1
    assert site.rows() == 0 and site.records(key) == 1
