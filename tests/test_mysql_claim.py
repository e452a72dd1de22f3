"""MariaDB's one-statement claim (INSERT ... ON DUPLICATE KEY UPDATE <key> = <key> RETURNING <winner>) on a live
server: a duplicate is reported without an error, the winner's columns come back exactly, nothing else is silenced,
and the exclusive lock the no-op update takes does not turn a replay into an in-flight answer. MySQL (no RETURNING)
keeps the plain INSERT and its 1062; so does MariaDB when told it has no RETURNING (checked here too).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from idem_dialects_bench import Recorder, record_statements
from mysql_common import *  # noqa: F403  (fixtures: admin, make_database, make_store, server, server_url)
from mysql_common import BACKENDS, REQ, LiveServer
from sqlalchemy import Index, event
from sqlalchemy.exc import IntegrityError

from idem_dialects import Claimed, IdempotencyStore, InFlight, Mismatch, Replayed, RequestInFlight
from idem_dialects.dialects.mysql import MySQLFeatures, _winner
from idem_dialects.dialects.mysql_errors import error_code


def _returning_store(make_store: Callable[..., IdempotencyStore], server: LiveServer, backend: str,
                     **options: Any) -> IdempotencyStore:
    if not server.is_mariadb:
        pytest.skip("INSERT ... RETURNING is MariaDB's (10.5+); MySQL claims with the plain INSERT")
    store = make_store(backend, **options)
    with store.transaction():
        pass  # the first transaction refines the features from the server
    assert isinstance(store.backend.features, MySQLFeatures) and store.backend.features.insert_returning
    return store


def _recorded_twin(store: IdempotencyStore) -> tuple[IdempotencyStore, Recorder]:
    """A store on the same engine and tables whose statements a Recorder sees, its features already refined."""
    recorder = Recorder()
    twin = IdempotencyStore(store.engine, table_prefix=store.table_prefix, statement_hook=recorder)
    with twin.transaction():
        pass  # reads the server's settings: not the request's statements
    return twin, recorder


def _errors(store: IdempotencyStore) -> list[BaseException]:
    """Every error SQLAlchemy handles on this store's engine from now on (the native path reports them too)."""
    seen: list[BaseException] = []
    event.listen(store.engine, "handle_error", lambda ctx: seen.append(ctx.original_exception))
    return seen


@pytest.mark.parametrize("response", [b"", b"a|b|\x00\xff|", "text | with bars", {"k": [1, None]}, ""])
@pytest.mark.parametrize("backend", BACKENDS)
def test_replay_raises_nothing_and_is_exact(make_store: Callable[..., IdempotencyStore], server: LiveServer,
                                            backend: str, response: Any) -> None:
    """A replay is one statement, with no error anywhere on its path, and gives back the stored status and response
    byte for byte (the packed winner splits on a separator the response may contain)."""
    store = _returning_store(make_store, server, backend)
    first = store.run(scope="s", operation="op", key="k", request=REQ, status=201, effect=lambda conn: response)
    twin, recorder = _recorded_twin(store)
    errors = _errors(store)  # from the replay on: the twin's first transaction asks the server what it has
    with record_statements(store.engine, recorder) as log:
        again = twin.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "never")
    assert (first.replayed, again.replayed) == (False, True)
    assert (again.response, again.status) == (response, 201) and type(again.response) is type(response)
    assert log.kinds == ["INSERT"] and errors == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_losers_answers_from_the_packed_winner(make_store: Callable[..., IdempotencyStore], server: LiveServer,
                                               backend: str) -> None:
    """In flight under a lease (retry_after from the database's clock), a different request (Mismatch), and our own
    leased claim whose commit went through (Claimed again, with the same token)."""
    store = _returning_store(make_store, server, backend)
    lease = timedelta(seconds=30)
    with store.transaction() as conn:
        store.claim(conn, scope="s", operation="op", key="k", request=REQ, lease=lease)
    with store.transaction() as conn:
        busy = store.claim(conn, scope="s", operation="op", key="k", request=REQ)
        other = store.claim(conn, scope="s", operation="op", key="k", request={"amount": 2})
    assert isinstance(busy, InFlight) and 25 < busy.retry_after <= 30 and isinstance(busy.locked_until, datetime)
    assert isinstance(other, Mismatch)
    req = store.claims.request("s", "op", "mine", REQ, lease)
    with store.transaction() as conn:
        first = store.drive(store.claims.claim(req), conn)
    with store.transaction() as conn:
        again = store.drive(store.claims.claim(req), conn)
    assert isinstance(first, Claimed) and isinstance(again, Claimed)
    assert again.token == first.token and not again.taken_over


def test_winner_parsing() -> None:
    """Six ASCII fields, then the response's bytes as they are; an empty completed_at means in flight (no response)."""
    done = _winner(b"f" * 64 + b"|tok|2026-01-02 03:04:05.000006|2026-01-02 03:04:06.123456|"
                   b"2026-01-02 03:04:07.000000|201||x|\x00")
    assert (done.fingerprint, done.claim_token, done.status, done.response) == ("f" * 64, "tok", 201, b"|x|\x00")
    assert done.locked_until == datetime(2026, 1, 2, 3, 4, 5, 6) and done.completed_at is not None
    empty = _winner(b"fp|tok|2026-01-02 03:04:05.000000|2026-01-02 03:04:05.000000|2026-01-02 03:04:05.000000|200|")
    assert empty.response == b"" and empty.status == 200
    flying = _winner(b"fp|tok|2026-01-02 03:04:05.000000||2026-01-02 03:04:05.000000||")
    assert (flying.completed_at, flying.status, flying.response) == (None, None, None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_another_unique_key_keeps_the_plain_insert(make_store: Callable[..., IdempotencyStore], server: LiveServer,
                                                   backend: str) -> None:
    """ON DUPLICATE KEY fires on any unique key: on a record table with another one the claim is the plain INSERT,
    whose 1062 from that other key propagates instead of returning another key's record as the winner."""
    store = _returning_store(make_store, server, backend)
    table = store.tables.records
    index = Index(f"{store.table_prefix}fp_uq", table.c.fingerprint, unique=True)
    index.create(store.engine)
    try:
        store.run(scope="s", operation="op", key="k1", request=REQ, effect=lambda conn: "first")
        with pytest.raises(IntegrityError) as err:
            store.run(scope="s", operation="op", key="k2", request=REQ, effect=lambda conn: "second")
        assert error_code(err.value) == 1062
    finally:
        index.drop(store.engine)
        table.indexes.discard(index)


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_returning_the_plain_insert_claims(make_store: Callable[..., IdempotencyStore],
                                                   server: LiveServer, backend: str) -> None:
    """MySQL's path (no RETURNING), run on MariaDB: the INSERT's 1062, then the locking read."""
    store = _returning_store(make_store, server, backend)
    store.backend.features = store.backend.features.replace(insert_returning=False)
    store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "once")
    twin, recorder = _recorded_twin(store)
    twin.backend.features = twin.backend.features.replace(insert_returning=False)
    with record_statements(store.engine, recorder) as log:
        again = twin.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "never")
    assert again.replayed and again.response == "once" and log.kinds == ["INSERT", "SELECT"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_conflict_option_replays_beside_a_concurrent_replay(make_store: Callable[..., IdempotencyStore],
                                                           server: LiveServer, backend: str) -> None:
    """The no-op update locks a completed record exclusively until its transaction ends, so a second replayer
    with on_in_flight="conflict" meets a lock; it still replays (a completed record stays complete), and an
    in-flight claim still answers InFlight."""
    store = _returning_store(make_store, server, backend)
    store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "done")
    with store.transaction() as holder:
        assert isinstance(store.claim(holder, scope="s", operation="op", key="k", request=REQ), Replayed)
        result: list[Any] = []
        worker = threading.Thread(target=lambda: result.append(store.run(
            scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "never", on_in_flight="conflict")))
        worker.start()
        worker.join(30)
        assert result and result[0].replayed and result[0].response == "done"
    with store.transaction() as holder:
        store.claim(holder, scope="s", operation="op", key="fresh", request=REQ)
        with pytest.raises(RequestInFlight):
            store.run(scope="s", operation="op", key="fresh", request=REQ, effect=lambda conn: "never",
                      on_in_flight="conflict")
