"""Django on MariaDB (issue 47): a response under the policy's `max_response_bytes` but over the server's
`max_allowed_packet` as PyMySQL sends it runs the view once. The key completes with the `response-too-large` problem,
which every retry gets: in atomic mode the view's write rolled back, in lease mode past the lease its write (its own)
made once; the views record each run in another database, where no transaction of the store holds it. On the
machine's MariaDB (read, never changed) with its limit from the start; and on a private MariaDB server, whose limit is
lowered after the store started (each new session's limit is read, so the response is refused before it is sent to a
session that would refuse it): the fixtures of tests/mariadb_packet_common.py, with which
tests/http/test_http_mariadb_limits.py tests FastAPI and Flask."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django_common import Site, database_alias, new_key
from mariadb_packet_common import *  # noqa: F403  (fixtures: packet, private_mariadb)
from mariadb_packet_common import BODY, HIGH, LOW
from sqlalchemy.engine import URL

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")
PROBLEM = "https://idem-dialects.readthedocs.io/en/latest/http.html#response-too-large"
PRIVATE = "private"  # the private server's database alias, for this module's tests


def too_large(resp: Any) -> None:
    assert resp.status_code == 500, resp.text[:300]
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.json()["type"] == PROBLEM


def retried(site: Site, view: str, key: str, headers: dict[str, str]) -> tuple[Any, Any]:
    """The first answer for `key` and a retry's: in lease mode once the first claim's lease is over by the database's
    clock (a claim left in flight would be taken over by the retry, running the view again)."""
    from django_site.views import BIG_LEASE

    first = site.post(view, key, headers=headers)
    if view == "big-external":
        site.past_the_lease(key, BIG_LEASE)
    return first, site.post(view, key, headers=headers)


def ran_once(site: Site, view: str, key: str, first: Any, again: Any) -> None:
    """The view ran once for `key` (its one recorded run), and the key holds the problem, not the response: every
    answer is it, the retry's replayed."""
    from django_site.views import CALLS

    too_large(first)
    too_large(again)
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert site.runs(view, key) == 1 and CALLS[f"{site.alias}:{view}:{key}"] == 1
    assert site.records(key) == 1
    # Atomic: the view's write rolled back with the claim. Lease: its write was its own, made once.
    assert site.rows("acct-big") == (1 if view == "big-external" else 0)


@pytest.mark.parametrize("view", ["big", "big-external"])
def test_a_response_over_the_servers_limit_runs_the_view_once_and_every_retry_gets_the_problem(site: Site,
                                                                                             view: str) -> None:
    from django.db import connections

    if connections[site.alias].vendor != "mysql":
        pytest.skip("only MySQL and MariaDB take less in one statement than the policy stores (max_allowed_packet)")
    with connections[site.alias].cursor() as cursor:
        cursor.execute("SELECT @@SESSION.max_allowed_packet")
        packet = int(cursor.fetchone()[0])
    size = packet // 2 + 64 * 1024  # under the policy's 64 MiB; over the server's limit as PyMySQL sends it
    assert size < 1 << 26
    key = new_key()
    first, again = retried(site, view, key, {"X-Account": "acct-big", "X-Size": str(size)})
    ran_once(site, view, key, first, again)


@pytest.fixture(scope="module")
def private_alias(private_mariadb: URL, django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """The private MariaDB server as the database alias PRIVATE, for this module's tests."""
    from django_site.settings import mariadb_database

    with database_alias(PRIVATE, mariadb_database(private_mariadb), django_db_blocker):
        yield PRIVATE


@pytest.fixture
def private_site(private_alias: str, packet: Callable[[int], None], live_server: Any) -> Iterator[Site]:
    """The test project's views on the private server, through a store of the test's own, which starts with the
    server's limit at HIGH; the test lowers it (`packet`). Its own: IDEMPOTENCY changed (a table prefix of the test's
    own) makes the stores anew, and a store's limit, once lowered, is never raised again."""
    from django.conf import settings
    from django.test import override_settings

    from idem_dialects.django import get_store

    packet(HIGH)
    with override_settings(IDEMPOTENCY={**settings.IDEMPOTENCY, "TABLE_PREFIX": f"lim{secrets.token_hex(3)}_"}):
        store = get_store(private_alias)
        store.create_tables()
        try:
            yield Site(live_server.url, private_alias)
        finally:
            store.drop_tables()


@pytest.mark.django_db(transaction=True, databases=["default", PRIVATE])  # "default": where the views record runs
@pytest.mark.parametrize("view", ["big", "big-external"], ids=["atomic", "lease"])
def test_with_the_servers_limit_lowered_after_the_store_started_the_view_still_runs_once(
        private_site: Site, packet: Callable[[int], None], view: str) -> None:
    site = private_site
    small = site.post(view, new_key(), headers={"X-Account": "acct-small", "X-Size": "1024"})
    assert small.status_code == 201, small.text[:300]  # the store has started, and read the server's limit
    packet(LOW)  # then lowered, as by a failover to a server configured lower: every new session has it
    key = new_key()
    first, again = retried(site, view, key, {"X-Account": "acct-big", "X-Size": str(BODY)})
    ran_once(site, view, key, first, again)
    assert site.rows("acct-small") == 1  # the small response's write
