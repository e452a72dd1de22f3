"""Checks: the isolation levels a backend declares are the ones its connections really run at."""

from __future__ import annotations

from collections.abc import Callable

from idem_dialects import IdempotencyStore

from .plugin import EngineUnderTest

REQ = {"amount": 100}


def test_declared_isolation_levels_work(make_store: Callable[..., IdempotencyStore], idem_engine: EngineUnderTest,
                                        observe: Callable[[str, object], None]) -> None:
    """Each isolation level the backend declares is accepted, really in effect on its connections, and runs the
    protocol (first run, then replay); records the engine's default level."""
    default = make_store()
    with default.engine.connect() as conn:
        observe("default isolation level", conn.get_isolation_level())
    levels = default.features.isolation_levels
    assert levels, "a backend must declare at least one isolation level"
    for i, level in enumerate(levels):
        store = make_store(isolation_level=level)
        with store.engine.connect() as conn:
            assert conn.get_isolation_level() == level
        # The level the effect's own connection runs at (the async store's driver connection, under --idem-api async).
        first = store.run(scope="s", operation="op", key=f"k{i}", request=REQ,
                          effect=lambda conn: conn.get_isolation_level())
        again = store.run(scope="s", operation="op", key=f"k{i}", request=REQ, effect=lambda conn: "no")
        assert (first.replayed, again.replayed, again.response) == (False, True, level)
    observe("isolation levels declared", ", ".join(levels))
