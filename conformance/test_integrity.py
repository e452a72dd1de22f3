"""Checks: the effect's own integrity errors are the caller's errors - surfaced as raised, never taken for a
duplicate key, never retried, never leaving a record behind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from idem_dialects import IdempotencyStore

from .support import Effects

REQ = {"amount": 100}
Observe = Callable[[str, object], None]


def _no_record(store: IdempotencyStore) -> None:
    with store.engine.connect() as conn:
        assert conn.execute(select(store.tables.records)).first() is None, "a record outlived the failed effect"


def _fails_once(store: IdempotencyStore, effects: Effects, effect: Callable[[Any], Any], observe: Observe,
                label: str) -> None:
    calls: list[int] = []

    def counted(conn: Any) -> Any:
        calls.append(1)
        return effect(conn)

    with pytest.raises(IntegrityError) as err:
        store.run(scope="s", operation="op", key="k", request=REQ, effect=counted)
    assert len(calls) == 1, f"the effect ran {len(calls)} times: its integrity error was retried"
    assert sum(store.retries.values()) == 0, f"retries counted for an effect's own error: {dict(store.retries)}"
    _no_record(store)
    orig = err.value.orig
    observe(f"{label} surfaces as", f"{type(orig).__module__}.{type(orig).__name__}")
    # The key is free again: a corrected request runs its effect.
    result = store.run(scope="s", operation="op", key="k", request=REQ, effect=effects.effect("k"))
    assert not result.replayed and effects.count("k") == 1


def test_effect_unique_violation_surfaces(idem_store: IdempotencyStore, idem_effects: Effects,
                                          idem_observe: Observe) -> None:
    """An effect's own unique violation reaches the caller as IntegrityError: not a duplicate key, not retried,
    no record left."""
    with idem_store.transaction() as conn:
        idem_effects.apply(conn, "seed", ref="taken")
    _fails_once(idem_store, idem_effects, lambda conn: idem_effects.apply(conn, "k", ref="taken"), idem_observe,
                "effect's unique violation")


def test_effect_not_null_violation_surfaces(idem_store: IdempotencyStore, idem_effects: Effects,
                                            idem_observe: Observe) -> None:
    """An effect's NOT NULL violation reaches the caller as IntegrityError: not retried, and no record remains."""

    def effect(conn: Any) -> Any:
        conn.execute(insert(idem_effects.table).values(id="n" * 32, k="k", amount=None))

    _fails_once(idem_store, idem_effects, effect, idem_observe, "effect's NOT NULL violation")


def test_insert_if_absent_reports_other_integrity_errors(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """The claim insert returns False only for its own primary key; a NOT NULL violation or another unique index's
    violation propagates as IntegrityError instead of passing for a duplicate."""
    backend = idem_store.backend
    row = dict(id="a" * 32, k="k", amount=1, ref="r1")
    with idem_store.transaction() as conn:  # the backend's statement flow, run by the store's loop
        assert idem_store.drive(backend.insert_if_absent(idem_effects.table, row), conn) is True
    with idem_store.transaction() as conn:
        assert idem_store.drive(backend.insert_if_absent(idem_effects.table, dict(row, amount=2)), conn) is False
    with pytest.raises(IntegrityError), idem_store.transaction() as conn:  # same ref, other unique index
        idem_store.drive(backend.insert_if_absent(idem_effects.table, dict(row, id="b" * 32)), conn)
    with pytest.raises(IntegrityError), idem_store.transaction() as conn:
        idem_store.drive(backend.insert_if_absent(idem_effects.table, dict(row, id="c" * 32, ref="r2", amount=None)),
                         conn)
    records = idem_store.tables.records
    with pytest.raises(IntegrityError), idem_store.transaction() as conn:
        idem_store.claim(conn, scope="s", operation="op", key="k", request=REQ)
        values = dict(scope="s", operation="op", idem_key="other", fingerprint=None, claim_token="t" * 32)
        clock = {"created_at": 0.0, "locked_until": 0.0}
        # NOT NULL fingerprint on the records table itself
        idem_store.drive(backend.insert_if_absent(records, values, clock), conn)
    assert idem_effects.count("k") == 1
    _no_record(idem_store)
