"""Django on MariaDB (issue 47): a response under the policy's `max_response_bytes` but over the server's
`max_allowed_packet` as PyMySQL sends it (hex: two bytes per byte) runs the view once. The key completes with the
`response-too-large` problem, in atomic mode (the view's write rolled back) and in lease mode past the lease. The
machine's server is read, never changed (a limit lowered later: tests/http/test_http_mariadb_limits.py)."""

from __future__ import annotations

import time

import pytest
from django_common import Site, new_key

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")
PROBLEM = "https://idem-dialects.readthedocs.io/en/latest/http.html#response-too-large"


@pytest.mark.parametrize("view", ["big", "big-external"])
def test_a_response_over_the_servers_limit_runs_the_view_once_and_every_retry_gets_the_problem(site: Site,
                                                                                             view: str) -> None:
    from django.db import connections
    from django_site.views import CALLS

    if connections[site.alias].vendor != "mysql":
        pytest.skip("only MySQL and MariaDB take less in one statement than the policy stores (max_allowed_packet)")
    with connections[site.alias].cursor() as cursor:
        cursor.execute("SELECT @@SESSION.max_allowed_packet")
        packet = int(cursor.fetchone()[0])
    size = packet // 2 + 64 * 1024  # under the policy's 64 MiB; over the server's limit as PyMySQL sends it
    assert size < 1 << 26
    key, headers = new_key(), {"X-Account": "acct-big", "X-Size": str(size)}
    first = site.post(view, key, headers=headers)
    if view == "big-external":
        time.sleep(1.5)  # past the 1 s lease: a claim left in flight would be taken over by the retry
    again = site.post(view, key, headers=headers)
    for resp in (first, again):
        assert resp.status_code == 500 and resp.json()["type"] == PROBLEM, resp.text[:300]
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert CALLS[f"{site.alias}:{view}:{key}"] == 1
    assert site.records(key) == 1 and site.rows("acct-big") == 0
