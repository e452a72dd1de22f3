"""Checks: faults around the effect and the protocol. The effect's own exception always reaches the caller unchanged
and the effect never runs again because of an error that is not its own (a failing rollback); a leased run whose
claim committed but whose reply was lost carries on as the owner; connections cut by a fault proxy at every protocol
step, then every key re-sent, leave exactly one effect per key and no key blocked past its lease."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from idem_dialects import IdemError, IdempotencyStore, RequestInFlight, Result, RetryCause, RetryPolicy
from idem_dialects.engines import provisioning

from .faultproxy import Action, Fault, FaultProxy, statement
from .support import Effects

REQ = {"amount": 100}
Observe = Callable[[str, object], None]

def _end_session(store: IdempotencyStore, conn: Connection) -> str:
    """End the session `conn` runs on, so that its rollback fails; returns how. A backend whose provisioning does
    not say how to end a session from another one gets its DBAPI connection closed under it, which makes the
    rollback fail everywhere."""
    provision = provisioning(store.backend.name)
    if provision.end_session_sql is None or provision.session_id_sql is None or store.features.multi_primary:
        # (on a cluster another session may land on another node)
        conn.connection.dbapi_connection.close()  # type: ignore[union-attr]  # the async adapters await it
        return "its DBAPI connection closed under it"
    session_id = conn.exec_driver_sql(provision.session_id_sql).scalar_one()
    with store.engine.connect() as other:
        other.exec_driver_sql(provision.end_session_sql.format(id=int(session_id)))
        other.commit()
    return "its session terminated from another session"


@pytest.mark.idem_stack
@pytest.mark.parametrize("lease", [None, timedelta(seconds=30)], ids=["atomic", "leased"])
def test_effect_error_wins_over_failed_rollback(idem_store: IdempotencyStore, idem_effects: Effects,
                                                 idem_observe: Observe, lease: timedelta | None) -> None:
    """When the effect's session is ended and the effect then raises, the caller gets the effect's own exception
    (the failed rollback at most a note on it), the effect ran once, and nothing of it was stored."""
    store, effects, observe = idem_store, idem_effects, idem_observe
    if not store.features.processes:
        pytest.skip("the database lives in its one shared connection (in-memory): ending that session destroys it")
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


@pytest.mark.idem_api("sync")  # patches the sync store's loop; test_async.py has the async store's twin
def test_leased_claim_commit_reply_lost_continues_as_owner(idem_store: IdempotencyStore, idem_effects: Effects,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A leased run whose claim COMMIT went through but whose reply was lost retries, finds its own claim token on
    the in-flight record and carries on as the owner: the run completes and the effect ran once."""
    store, effects = idem_store, idem_effects
    real = store.executor.transaction  # every transaction the store's loop opens
    lost: list[bool] = []

    @contextmanager
    def reply_lost_once(begin: Any) -> Iterator[Connection]:
        with real(begin) as conn:
            yield conn
        if not lost:  # the first transaction (the claim) committed; its reply "never arrived"
            lost.append(True)
            raise _lost_reply()

    monkeypatch.setattr(store.executor, "transaction", reply_lost_once)
    result = store.run(scope="s", operation="op", key="k", request=REQ, effect=effects.effect("k"),
                       lease=timedelta(seconds=30), retry=RetryPolicy(total=5))
    assert lost and not result.replayed
    assert effects.count("k") == 1
    again = store.run(scope="s", operation="op", key="k", request=REQ, effect=effects.effect("k"),
                      lease=timedelta(seconds=30))
    assert again.replayed and again.response == result.response and effects.count("k") == 1


# --- faults injected on the wire ------------------------------------------------------------------------------------

_LEASE = timedelta(seconds=2)
# The protocol's steps, as the statements that carry them; (step, pattern, nth) for each mode.
# The claim may be an INSERT inside a CTE that also returns the winner (PostgreSQL's claim), and be sent together
# with the BEGIN of its transaction (sync psycopg's).
_CLAIM = r"(?:BEGIN; )?(?:WITH \w+ AS\s*\(\s*)?INSERT INTO {records}"
_STEPS = {
    "atomic": [("claim", _CLAIM, 1), ("effect", "INSERT INTO {fx}", 1),
               ("complete", "UPDATE {records}", 1), ("commit", "COMMIT", 1)],
    "leased": [("claim", _CLAIM, 1), ("claim commit", "COMMIT", 1), ("effect", "INSERT INTO {fx}", 1),
               ("complete", "UPDATE {records}", 1), ("effect commit", "COMMIT", 2)],
}
_FAULTS: tuple[Action, ...] = ("cut_before", "cut_after", "lose_reply")


def _table_pattern(pattern: str, store: IdempotencyStore) -> str:
    names = {"records": store.tables.records.name, "fx": f"{store.table_prefix}fx"}
    return pattern.format(**{k: f"[`\"]?{re.escape(v)}[`\"]?\\b" for k, v in names.items()})


def _resend(store: IdempotencyStore, key: str, effects: Effects, lease: timedelta | None) -> Result:
    """Re-send a key as a client must after a fault: the same key, waiting out a live lease (never longer: the
    database's clock, which InFlight's `retry_after` reads, says how long the claim still holds)."""
    while True:
        try:
            return store.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key), lease=lease)
        except RequestInFlight as exc:
            assert lease is not None and exc.retry_after <= lease.total_seconds(), \
                f"key {key!r} in flight for {exc.retry_after:.1f} s more, past its lease ({lease})"
            time.sleep(min(exc.retry_after, 0.5) + 0.01)


@pytest.mark.idem_stack
@pytest.mark.parametrize("mode", ["atomic", "leased"])
def test_wire_faults_at_every_step(idem_make_store: Callable[..., IdempotencyStore], idem_fault_proxy: FaultProxy,
                                   mode: str, idem_observe: Observe) -> None:
    """Connections cut before or after each protocol statement, and COMMIT replies lost, through a fault proxy:
    `run` absorbs each fault or reports it as an IdemError (never a raw driver error), and once every key is
    re-sent there is exactly one effect per key and no key is blocked past its lease."""
    proxy, observe = idem_fault_proxy, idem_observe
    direct = idem_make_store()
    effects = Effects(direct)
    effects.create()
    proxied = idem_make_store(proxy.proxied_url())
    lease = _LEASE if mode == "leased" else None
    keys = []
    outcomes: dict[str, str] = {}  # "<fault> at <step>" -> what the caller saw
    try:
        for step, pattern, nth in _STEPS[mode]:
            for action in _FAULTS:
                key = f"{mode}-{step}-{action}"
                keys.append(key)
                fault = proxy.arm(Fault(action, statement(_table_pattern(pattern, direct)), nth))
                try:
                    result = proxied.run(scope="s", operation="op", key=key, request=REQ,
                                         effect=effects.effect(key), lease=lease, retry=RetryPolicy(total=10))
                    # Nobody else sends this key: even after a lost COMMIT reply the result is the caller's own.
                    assert not result.replayed, f"{key}: its own first result came back as a replay"
                    outcomes[f"{action} at {step}"] = "result"
                except IdemError as exc:
                    outcomes[f"{action} at {step}"] = type(exc).__name__
                assert fault.fired is not None, f"{key}: the fault never fired ({proxy.statements[-8:]})"
        for key in keys:
            _resend(direct, key, effects, lease)
        assert effects.per_key() == dict.fromkeys(keys, 1)
        tally = ", ".join(f"{what} x{n}" for what, n in sorted(Counter(outcomes.values()).items()))
        unusual = "; ".join(f"{where}: {what}" for where, what in outcomes.items() if what != "result")
        observe(f"{mode} run under {len(keys)} wire faults (cut before/after each statement, COMMIT reply lost)",
                f"caller saw {tally} ({unusual or 'no exception'}); re-sent: 1 effect per key")
    finally:
        effects.drop()


@pytest.mark.idem_stack
def test_leased_claim_commit_reply_lost_on_the_wire(idem_make_store: Callable[..., IdempotencyStore],
                                                    idem_fault_proxy: FaultProxy) -> None:
    """The server commits a leased claim and its reply is lost on the wire: `run` completes as the owner (not
    RequestInFlight for the whole lease) and the effect ran once."""
    direct = idem_make_store()
    effects = Effects(direct)
    effects.create()
    try:
        proxied = idem_make_store(idem_fault_proxy.proxied_url())
        fault = idem_fault_proxy.arm(Fault("lose_reply", statement("COMMIT")))
        result = proxied.run(scope="s", operation="op", key="k", request=REQ, effect=effects.effect("k"),
                             lease=timedelta(seconds=60), retry=RetryPolicy(total=10))
        assert fault.fired is not None and not result.replayed
        # The lost link surfaces on the statement after the COMMIT, or (through a cluster's proxy) on reconnecting.
        lost = proxied.retries[RetryCause.CONNECTION] + proxied.retries[RetryCause.CONNECT]
        assert effects.count("k") == 1 and lost >= 1, dict(proxied.retries)
    finally:
        effects.drop()
