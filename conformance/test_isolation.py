"""Checks: the isolation levels a backend declares are the ones its connections really run at."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event

from idem_dialects import IdempotencyStore, UnsupportedIsolation, dialects

from .plugin import EngineUnderTest
from .support import StatementLog, effects_table

REQ = {"amount": 100}
# Every level SQLAlchemy spells for some engine, plus AUTOCOMMIT (which no backend may declare).
KNOWN_LEVELS = ("AUTOCOMMIT", "READ UNCOMMITTED", "READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE", "SNAPSHOT")


@pytest.mark.idem_stack
def test_declared_isolation_levels_work(idem_make_store: Callable[..., IdempotencyStore], idem_engine: EngineUnderTest,
                                        idem_observe: Callable[[str, object], None]) -> None:
    """Each isolation level the backend declares is accepted, really in effect on its connections, and runs the
    protocol (first run, then replay); records the engine's default level."""
    default = idem_make_store()
    with default.engine.connect() as conn:
        idem_observe("default isolation level", conn.get_isolation_level())
    levels = default.features.isolation_levels
    assert levels, "a backend must declare at least one isolation level"
    for i, level in enumerate(levels):
        store = idem_make_store(isolation_level=level)
        store.create_tables()  # idempotent; an in-memory SQLite database belongs to one engine, so it starts empty
        with store.engine.connect() as conn:
            assert conn.get_isolation_level() == level
        # The level the effect's own connection runs at (the async store's driver connection, under --idem-api async).
        first = store.run(scope="s", operation="op", key=f"k{i}", request=REQ,
                          effect=lambda conn: conn.get_isolation_level())
        again = store.run(scope="s", operation="op", key=f"k{i}", request=REQ, effect=lambda conn: "no")
        assert (first.replayed, again.replayed, again.response) == (False, True, level)
    idem_observe("isolation levels declared", ", ".join(levels))


def _count_connects(engine: Engine) -> list[object]:
    """A list that grows by one each time `engine` opens a DBAPI connection."""
    connects: list[object] = []
    event.listen(engine, "connect", lambda dbapi_conn, record: connects.append(dbapi_conn))
    return connects


@pytest.mark.idem_api("sync")  # the async store proves the same in test_async.py
def test_undeclared_isolation_refused_before_sql(idem_engine: EngineUnderTest,
                                                 idem_make_store: Callable[..., IdempotencyStore],
                                                 idem_observe: Callable[[str, object], None]) -> None:
    """A store refuses an engine configured with AUTOCOMMIT or any isolation level its backend does not declare,
    and a claim on a connection switched to one, with UnsupportedIsolation naming the supported levels - before
    any SQL runs (under AUTOCOMMIT a failing effect would leave its claim behind and run again)."""
    declared = idem_engine.features.isolation_levels
    refused = [level for level in KNOWN_LEVELS if level not in declared]
    assert "AUTOCOMMIT" in refused
    for level in refused:
        engine = create_engine(idem_engine.url, isolation_level=level)
        connects = _count_connects(engine)
        try:
            with pytest.raises(UnsupportedIsolation) as err:
                IdempotencyStore(engine)
        finally:
            engine.dispose()
        assert (err.value.level, err.value.supported) == (level, tuple(declared))
        assert all(supported in str(err.value) for supported in declared)
        assert connects == [], "the store connected before refusing"
        with pytest.raises(UnsupportedIsolation):
            IdempotencyStore.from_url(idem_engine.url, isolation_level=level)
    statements = StatementLog()
    idem_store = idem_make_store(statement_hook=statements)
    statements.sql.clear()
    with idem_store.engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(UnsupportedIsolation):
            idem_store.claim(auto, scope="s", operation="op", key="k", request=REQ)
    assert statements.sql == [], "the claim ran SQL before refusing AUTOCOMMIT"
    idem_observe("isolation levels refused", ", ".join(refused))


def _own_engine(store: Any) -> Engine:
    """The sync Engine the store's statements run on (an async store's: its AsyncEngine's sync facade)."""
    aio = getattr(store, "aio", None)  # the bridge's AsyncIdempotencyStore under --idem-api async
    return aio.engine.sync_engine if aio is not None else store.engine  # type: ignore[no-any-return]


def test_driver_autocommit_refused_before_sql(idem_engine: EngineUnderTest,
                                              idem_make_store: Callable[..., IdempotencyStore],
                                              idem_observe: Callable[[str, object], None]) -> None:
    """A store whose driver connections commit every statement alone - the driver's own autocommit in connect_args,
    or turned on in a connect event, where SQLAlchemy's isolation_level never hears of it - refuses `run` and
    `transaction` with UnsupportedIsolation naming the setting, before any SQL: an effect that writes and fails
    leaves nothing, twice, and the key is then run once by a correctly configured store."""
    plain = idem_make_store()  # creates the tables
    driver = idem_engine.url.get_driver_name()
    ways: dict[str, dict[str, Any]] = {"connect event": {}}
    known = dialects.driver(type(plain.backend), driver)
    if known is not None and known.autocommit_args is not None:
        ways["connect_args"] = {"connect_args": dict(known.autocommit_args)}
    with effects_table(plain) as fx:
        for i, (way, options) in enumerate(ways.items()):
            statements = StatementLog()
            store = idem_make_store(**options, statement_hook=statements)
            engine = _own_engine(store)
            if way == "connect event":  # SQLAlchemy's own per-driver way of switching autocommit on
                event.listen(engine, "connect", lambda dbapi, record, e=engine: e.dialect.set_isolation_level(
                    dbapi, "AUTOCOMMIT"))
            key = f"k{i}"

            def failing(conn: Any, key: str = key) -> Any:
                fx.apply(conn, key)
                raise RuntimeError("the effect fails after writing")

            for _ in range(2):
                with pytest.raises(UnsupportedIsolation) as err:
                    store.run(scope="s", operation="op", key=key, request=REQ, effect=failing)
                assert err.value.level == "AUTOCOMMIT" and err.value.setting, err.value
                assert err.value.setting in str(err.value) and "remove that setting" in str(err.value)
            with pytest.raises(UnsupportedIsolation), store.transaction():
                pass
            assert statements.sql == [], f"{way}: the store ran SQL before refusing autocommit"
            assert fx.count(key) == 0, f"{way}: an effect ran on an autocommit connection"
            first = plain.run(scope="s", operation="op", key=key, request=REQ, effect=fx.effect(key))
            again = plain.run(scope="s", operation="op", key=key, request=REQ, effect=fx.effect(key))
            assert (first.replayed, again.replayed, fx.count(key)) == (False, True, 1)
            idem_observe(f"driver autocommit by {way}", f"refused before SQL ({err.value.setting})")
