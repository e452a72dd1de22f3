"""Django on MariaDB (issue 47): a response under the policy's `max_response_bytes` but over the server's
`max_allowed_packet` as PyMySQL sends it runs the view once. The key completes with the `response-too-large` problem,
which every retry gets: in atomic mode the view's write rolled back, in lease mode past the lease its write (its own)
made once; the views record each run in another database, where no transaction of the store holds it. The machine's
server is read, never changed (a limit lowered later: tests/http/test_http_mariadb_limits.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django_common import Site, new_key

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")
PROBLEM = "https://idem-dialects.readthedocs.io/en/latest/http.html#response-too-large"


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
