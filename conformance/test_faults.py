"""Checks: faults around the effect and the protocol. The effect's own exception always reaches the caller unchanged
and the effect never runs again because of an error that is not its own (a failing rollback); a leased run whose
claim committed but whose reply was lost carries on as the owner; connections cut by a fault proxy at every protocol
step, then every key re-sent, leave exactly one effect per key and no key blocked past its lease."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from idem_dialects import IdempotencyStore, RetryPolicy

from .support import Effects

REQ = {"amount": 100}
Observe = Callable[[str, object], None]

# How to end the effect's own session from another one, by backend (reading the id on the effect's connection).
# A backend not named here gets its DBAPI connection closed under it, which makes the rollback fail everywhere.
_KILL_SESSION: dict[str, tuple[str, str]] = {
    "postgresql": ("SELECT pg_backend_pid()", "SELECT pg_terminate_backend({id})"),
    "mariadb": ("SELECT CONNECTION_ID()", "KILL CONNECTION {id}"),
    "mysql": ("SELECT CONNECTION_ID()", "KILL CONNECTION {id}"),
}


def _end_session(store: IdempotencyStore, conn: Connection) -> str:
    """End the session `conn` runs on, so that its rollback fails; returns how."""
    kill = _KILL_SESSION.get(store.backend.name)
    if kill is None:
        conn.connection.driver_connection.close()  # type: ignore[union-attr]
        return "its DBAPI connection closed under it"
    session_id = conn.exec_driver_sql(kill[0]).scalar()
    with store.engine.connect() as other:
        other.exec_driver_sql(kill[1].format(id=int(session_id)))
        other.commit()
    return "its session terminated from another session"


@pytest.mark.parametrize("lease", [None, timedelta(seconds=30)], ids=["atomic", "leased"])
def test_effect_error_wins_over_failed_rollback(store: IdempotencyStore, effects: Effects, observe: Observe,
                                                 lease: timedelta | None) -> None:
    """When the effect's session is ended and the effect then raises, the caller gets the effect's own exception
    (the failed rollback at most a note on it), the effect ran once, and nothing of it was stored."""
    calls: list[str] = []

    def effect(conn: Connection) -> Any:
        effects.apply(conn, "k")
        calls.append(_end_session(store, conn))
        raise ValueError("payment provider said no")

    with pytest.raises(ValueError, match="payment provider said no") as err:
        store.run(scope="s", operation="op", key="k", request=REQ, effect=effect, lease=lease,
                  retry=RetryPolicy(total=5))
    assert len(calls) == 1, f"the effect ran {len(calls)} times"
    assert type(err.value) is ValueError
    assert sum(store.retries.values()) == 0, dict(store.retries)
    assert effects.count("k") == 0
    notes = getattr(err.value, "__notes__", [])
    observe(f"effect raises after {calls[0]} ({'leased' if lease else 'atomic'})",
            f"caller got ValueError, effect ran once; {len(notes)} note(s) on it")
    # The key is free again (atomic: nothing committed; leased: released, or the lease is the caller's to wait).
    if lease is None:
        result = store.run(scope="s", operation="op", key="k", request=REQ, effect=effects.effect("k"))
        assert not result.replayed and effects.count("k") == 1


def _lost_reply() -> OperationalError:
    return OperationalError("COMMIT", {}, ConnectionError("server closed the connection unexpectedly"),
                            connection_invalidated=True)


def test_leased_claim_commit_reply_lost_continues_as_owner(store: IdempotencyStore, effects: Effects,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A leased run whose claim COMMIT went through but whose reply was lost retries, finds its own claim token on
    the in-flight record and carries on as the owner: the run completes and the effect ran once."""
    real = store.transaction
    lost: list[bool] = []

    @contextmanager
    def reply_lost_once() -> Iterator[Connection]:
        with real() as conn:
            yield conn
        if not lost:  # the first transaction (the claim) committed; its reply "never arrived"
            lost.append(True)
            raise _lost_reply()

    monkeypatch.setattr(store, "transaction", reply_lost_once)
    result = store.run(scope="s", operation="op", key="k", request=REQ, effect=effects.effect("k"),
                       lease=timedelta(seconds=30), retry=RetryPolicy(total=5))
    assert lost and not result.replayed
    assert effects.count("k") == 1
    again = store.run(scope="s", operation="op", key="k", request=REQ, effect=effects.effect("k"),
                      lease=timedelta(seconds=30))
    assert again.replayed and again.response == result.response and effects.count("k") == 1
