"""IdempotencyMiddleware (settings.IDEMPOTENCY) after Django's authentication: the scope is request.user, the
record shares the view's transaction on IDEMPOTENCY['DATABASE'], on every engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from django_common import Site, new_key

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")
PROBLEM = "https://idem-dialects.readthedocs.io/en/latest/http.html#"


@pytest.fixture
def mw(site: Site) -> Iterator[Site]:
    config = {"DATABASE": site.alias, "POLICY": {"paths": lambda path: path.startswith("/mw/")}}
    with override_settings(IDEMPOTENCY=config):
        yield site


def post(site: Site, key: str | None, user: str | None = "carol", **headers: str) -> Any:
    sent = dict(headers)
    if user:
        sent["X-Remote-User"] = user
    return site.post("/mw/payments", key, user=None, headers=sent)


def test_replay_and_scope_from_request_user(mw: Site) -> None:
    key = new_key()
    carol = post(mw, key, "carol")
    assert carol.status_code == 201 and carol.json()["user"] == "carol"
    again = post(mw, key, "carol")
    assert again.headers["idempotent-replayed"] == "true" and again.content == carol.content
    dave = post(mw, key, "dave")  # the same key, another user: their own result
    assert dave.status_code == 201 and "idempotent-replayed" not in dave.headers and dave.json()["user"] == "dave"
    assert mw.rows("carol") == 1 and mw.rows("dave") == 1 and mw.records(key) == 2


def test_anonymous_is_401_and_the_view_does_not_run(mw: Site) -> None:
    resp = post(mw, new_key(), user=None)
    assert resp.status_code == 401 and resp.json()["type"] == PROBLEM + "unauthenticated"
    assert mw.rows() == 0


def test_view_raising_after_its_write_is_a_500_with_neither_row_nor_record(mw: Site) -> None:
    key = new_key()
    resp = post(mw, key, **{"X-Explode": "1"})
    assert resp.status_code == 500  # Django turned the exception into its 500 response inside the middleware
    assert mw.rows() == 0 and mw.records(key) == 0
    assert post(mw, key).status_code == 201 and mw.rows() == 1


@pytest.mark.parametrize("view", ["django", "drf"])
def test_an_http_exception_raised_after_a_write_rolls_it_back_and_the_retry_replays_it(mw: Site, view: str) -> None:
    """Django's PermissionDenied (the middleware sees the view raise) and DRF's (DRF answers it inside its view,
    marking the response): the write rolls back, the answer is stored on its own, the retry runs nothing."""
    from django_site.views import CALLS

    key = new_key()
    path = "/mw/payments" if view == "django" else "/mw/drf"
    headers = {"X-Remote-User": "carol", "X-Refuse": "1"}
    first = mw.post(path, key, user=None, headers=headers)
    again = mw.post(path, key, user=None, headers=headers)
    assert first.status_code == again.status_code == 403, first.text
    assert "idempotent-replayed" not in first.headers and again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    name = "middleware" if view == "django" else "middleware-drf"
    assert CALLS[f"{mw.alias}:{name}:{key}"] == 1 and mw.rows() == 0 and mw.records(key) == 1


def test_a_streaming_response_passes_through_unbuffered_with_a_warning_and_nothing_stored(mw: Site) -> None:
    """Server-sent events (a StreamingHttpResponse) go out as the view streams them, with an IdemWarning naming the
    route, and nothing is stored: such a route is not idempotent (issue 47; before, it was buffered whole)."""
    from django_site.views import CALLS, EVENTS_GATE, EVENTS_SEEN

    from idem_dialects import IdemWarning

    key = new_key()
    EVENTS_GATE.clear()
    EVENTS_SEEN.clear()
    headers = {"X-Remote-User": "carol", "Idempotency-Key": f'"{key}"'}
    with pytest.warns(IdemWarning, match=r"POST /mw/events streamed its response"), mw.client(None) as client:
        with client.stream("POST", "/mw/events", headers=headers) as resp:
            chunks = resp.iter_bytes()
            first = next(chunks)
            EVENTS_GATE.set()  # the client has the first event while the stream is still open
            body = first + b"".join(chunks)
        again = client.post("/mw/events", headers=headers)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    assert body == b"data: first\n\ndata: second\n\n" and EVENTS_SEEN[0] is True
    assert again.status_code == 200 and "idempotent-replayed" not in again.headers
    assert CALLS[f"{mw.alias}:middleware-events:{key}"] == 2 and mw.records(key) == 0


def test_paths_outside_the_policy_pass_through(mw: Site) -> None:
    key = new_key()
    first = mw.post("payments", key)  # the decorated DRF view: its own decorator, not the middleware
    assert first.status_code == 201 and mw.records(key) == 1


def test_an_async_view_behind_the_middleware_shares_the_transaction(mw: Site) -> None:
    key = new_key()
    failed = mw.post("/mw/async", key, user=None, headers={"X-Remote-User": "carol", "X-Explode": "1"})
    assert failed.status_code == 500 and mw.rows() == 0 and mw.records(key) == 0
    first = mw.post("/mw/async", key, user=None, headers={"X-Remote-User": "carol"})
    again = mw.post("/mw/async", key, user=None, headers={"X-Remote-User": "carol"})
    assert first.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content and mw.rows() == 1 and mw.records(key) == 1
