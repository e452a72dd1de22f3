"""on_in_flight="conflict" leaves the connection as it found it: the effect runs under the session's own lock wait,
and a pooled connection goes back with it, after a claim and after an in-flight answer alike (each engine's own
setting, read back with its own query)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idem_dialects import IdempotencyStore, RequestInFlight
from idem_dialects.engines import Unavailable, get

# The engine, and how its session's lock wait (what the conflict option changes for one statement) is read.
SETTINGS = {"sqlite": "PRAGMA busy_timeout", "postgresql": "SHOW lock_timeout",
            "mariadb": "SELECT @@SESSION.innodb_lock_wait_timeout"}


@pytest.fixture(params=sorted(SETTINGS))
def url_and_query(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    name: str = request.param
    if name == "sqlite":  # a file: two connections, one write lock
        yield f"sqlite:///{tmp_path / 'c.db'}", SETTINGS[name]
        return
    try:
        url = get(name).provide().url
    except Unavailable as exc:
        pytest.skip(f"{name} unavailable: {exc}")
    yield url.render_as_string(hide_password=False), SETTINGS[name]


def test_conflict_option_restores_the_sessions_lock_wait(url_and_query: tuple[str, str]) -> None:
    url, query = url_and_query
    prefix = f"cs{secrets.token_hex(3)}_"
    holder = IdempotencyStore.from_url(url, table_prefix=prefix)
    holder.create_tables()
    # One pooled connection: every statement below is on the connection the conflict option used.
    store = IdempotencyStore.from_url(url, table_prefix=prefix, pool_size=1, max_overflow=0)
    try:
        with store.engine.connect() as conn:
            before = conn.exec_driver_sql(query).scalar()
        seen: list[Any] = []
        result = store.run(scope="s", operation="op", key="k1", request={}, on_in_flight="conflict",
                           effect=lambda conn: seen.append(conn.exec_driver_sql(query).scalar()) or "done")
        assert result.response == "done" and seen == [before]  # the effect ran under the session's own setting

        started, gate = threading.Event(), threading.Event()

        def held(conn: Any) -> str:
            started.set()
            assert gate.wait(30)
            return "first"

        first = threading.Thread(target=lambda: holder.run(scope="s", operation="op", key="k2", request={},
                                                           effect=held))
        first.start()
        try:
            assert started.wait(30)
            with pytest.raises(RequestInFlight):
                store.run(scope="s", operation="op", key="k2", request={}, on_in_flight="conflict",
                          effect=lambda conn: "second")
        finally:
            gate.set()
            first.join(30)
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql(query).scalar() == before
    finally:
        store.close()
        holder.drop_tables()
        holder.close()


def test_conflict_option_is_refused_before_any_sql_when_misspelt(tmp_path: Path) -> None:
    from idem_dialects import InvalidPayload

    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'x.db'}") as store:
        with pytest.raises(InvalidPayload, match="on_in_flight"):
            store.run(scope="s", operation="op", key="k", request={}, effect=lambda c: 1,
                      on_in_flight="fail")  # type: ignore[arg-type]

