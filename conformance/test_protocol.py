"""Checks: the protocol's outcomes, validation, exact replay, leases, messages and retention on one engine."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from idem_dialects import (
    Claimed,
    IdempotencyStore,
    InFlight,
    InvalidKey,
    InvalidPayload,
    LeaseLost,
    Mismatch,
    Replayed,
    Reply,
    RequestInFlight,
    RequestMismatch,
)

from .support import Effects, StatementLog, returning

REQ = {"amount": 100, "currency": "EUR"}


@pytest.mark.idem_stack
def test_first_request_claims_and_runs_once(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """A first request runs its effect once and returns its response, not marked replayed."""
    result = idem_store.run(scope="acct:1", operation="debit:v1", key="k1", request=REQ,
                            effect=idem_effects.effect("k1"))
    assert result.replayed is False and result.status == 200
    assert idem_effects.count("k1") == 1


@pytest.mark.idem_stack
def test_retry_replays_stored_response(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """A retry with the same request replays the stored response and status without running the effect."""
    first = idem_store.run(scope="acct:1", operation="debit:v1", key="k1", request=REQ,
                           effect=idem_effects.effect("k1"))
    again = idem_store.run(scope="acct:1", operation="debit:v1", key="k1", request=REQ,
                           effect=idem_effects.effect("k1"))
    assert again.replayed is True
    assert (again.response, again.status) == (first.response, first.status)
    assert idem_effects.count("k1") == 1


def test_reordered_request_is_same_request(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """Requests equal as JSON (key order, 1 vs 1.0) are the same request: RFC 8785 canonical fingerprints."""
    idem_store.run(scope="s", operation="op", key="k", request={"a": 1, "b": [1.0, "x"]},
                   effect=idem_effects.effect("k"))
    again = idem_store.run(scope="s", operation="op", key="k", request={"b": [1, "x"], "a": 1.0},
                           effect=idem_effects.effect("k"))
    assert again.replayed and idem_effects.count("k") == 1


@pytest.mark.idem_stack
def test_mismatch_rejects_without_effect(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """Reusing a key with a different request raises RequestMismatch (422) and never runs the effect."""
    idem_store.run(scope="acct:1", operation="debit:v1", key="k1", request={"amount": 100},
                   effect=idem_effects.effect("k1"))
    with pytest.raises(RequestMismatch) as err:
        idem_store.run(scope="acct:1", operation="debit:v1", key="k1", request={"amount": 101},
                       effect=idem_effects.effect("k1"))
    assert err.value.http_status == 422 and err.value.key == "k1"
    assert idem_effects.count("k1") == 1


@pytest.mark.idem_stack
def test_step_by_step_outcomes(idem_store: IdempotencyStore) -> None:
    """claim returns Claimed, then Replayed (same request) or Mismatch (different request) once completed."""
    with idem_store.transaction() as conn:
        outcome = idem_store.claim(conn, scope="s", operation="op", key="k", request=REQ)
        assert isinstance(outcome, Claimed) and not outcome.taken_over
        idem_store.complete(conn, outcome, {"ok": True}, status=201)
    with idem_store.transaction() as conn:
        replay = idem_store.claim(conn, scope="s", operation="op", key="k", request=REQ)
        mismatch = idem_store.claim(conn, scope="s", operation="op", key="k", request={"other": 1})
    assert isinstance(replay, Replayed) and (replay.response, replay.status) == ({"ok": True}, 201)
    assert isinstance(mismatch, Mismatch) and mismatch.stored_fingerprint != mismatch.given_fingerprint


def test_failed_effect_leaves_no_record(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """An effect that raises rolls back with its claim: no record remains and the next attempt runs the effect."""

    def boom(conn: Any) -> Any:
        idem_effects.apply(conn, "k")
        raise RuntimeError("downstream failed")

    with pytest.raises(RuntimeError, match="downstream failed"):
        idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=boom)
    assert idem_effects.count("k") == 0
    with idem_store.engine.connect() as conn:
        assert conn.execute(select(idem_store.tables.records)).first() is None
    result = idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=idem_effects.effect("k"))
    assert not result.replayed and idem_effects.count("k") == 1


def test_scope_and_operation_isolate_keys(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """The same key under another scope or operation is a different record: each runs its own effect."""
    for scope, operation in [("t1", "op:v1"), ("t2", "op:v1"), ("t1", "op:v2")]:
        result = idem_store.run(scope=scope, operation=operation, key="same", request=REQ,
                                effect=idem_effects.effect("same"))
        assert not result.replayed
    assert idem_effects.count("same") == 3


def test_stored_status_replays(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """A non-2xx outcome stored with Reply(status=...) replays with that status, e.g. a 402 refusal."""
    first = idem_store.run(scope="s", operation="op", key="k", request=REQ,
                      effect=lambda conn: Reply({"error": "insufficient funds"}, status=402))
    again = idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=idem_effects.effect("k"))
    assert (first.status, again.status, again.replayed) == (402, 402, True)
    assert again.response == {"error": "insufficient funds"} and idem_effects.count() == 0


RESPONSES: list[Any] = [
    "", b"", None, 0, False, [], {}, "nul\x00inside", b"\x00\x01\xff", "\U0001f600 ß é", 1.5, -0.0, 2**70,
    {"nested": {"list": [1, "two", None, True]}}, b"x" * (1024 * 1024), "y" * (1024 * 1024),
]


@pytest.mark.parametrize("response", RESPONSES,
                         ids=lambda r: f"{type(r).__name__}{len(r) if hasattr(r, '__len__') else ''}")
def test_response_replays_exactly(idem_store: IdempotencyStore, response: Any) -> None:
    """Every response kind (JSON value or bytes, empty, NUL, 1 MB) replays with the same type and value."""
    idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: response)
    again = idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "not this")
    assert again.replayed
    assert type(again.response) is type(response) and again.response == response
    if isinstance(response, float):
        assert repr(again.response) == repr(response)  # -0.0 stays -0.0


BAD_IDENTIFIERS: list[tuple[Any, str]] = [
    ("", "must not be empty"), ("x" * 256, "at most 255"), ("a\x00b", "NUL"), ("\ud800", "lone surrogate"),
    (42, "must be a str"), (b"bytes", "must be a str"), (None, "must be a str"),
]


@pytest.mark.parametrize("field", ["scope", "operation", "key"])
@pytest.mark.parametrize(("value", "rule"), BAD_IDENTIFIERS,
                         ids=["empty", "256", "nul", "surrogate", "int", "bytes", "none"])
def test_invalid_identity_rejected_before_sql(idem_make_store: Callable[..., IdempotencyStore], field: str,
                                             value: Any, rule: str) -> None:
    """Bad scope/operation/key raises InvalidKey naming the field and rule, before any SQL runs."""
    args: dict[str, Any] = dict(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: 1)
    args[field] = value
    statements = StatementLog()
    store = idem_make_store(statement_hook=statements)
    statements.sql.clear()  # creating the tables ran SQL
    with pytest.raises(InvalidKey) as err:
        store.run(**args)
    assert err.value.field == field and rule in err.value.rule
    assert statements.sql == []


@pytest.mark.parametrize("request_value", [{1, 2}, float("nan"), {"k": b"bytes"}, {1: "int key"}, 2**60],
                         ids=["set", "nan", "bytes", "int-key", "unsafe-int"])
def test_invalid_request_rejected(idem_store: IdempotencyStore, idem_effects: Effects, request_value: Any) -> None:
    """A request that is not canonical JSON raises InvalidPayload (a TypeError) before anything is written."""
    with pytest.raises(InvalidPayload):
        idem_store.run(scope="s", operation="op", key="k", request=request_value, effect=idem_effects.effect("k"))
    assert idem_effects.count() == 0


def test_invalid_response_writes_nothing(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """An effect returning something unstorable rolls back: no effect, no record, a clear InvalidPayload."""

    def bad(conn: Any) -> Any:
        idem_effects.apply(conn, "k")
        return {"when": object()}

    with pytest.raises(InvalidPayload, match="response"):
        idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=bad)
    assert idem_effects.count() == 0
    with idem_store.engine.connect() as conn:
        assert conn.execute(select(idem_store.tables.records)).first() is None


@pytest.mark.idem_stack
def test_lease_in_flight_takeover_and_fencing(idem_store: IdempotencyStore) -> None:
    """A leased claim commits alone: others get InFlight (retry_after > 0); once expired one takes it over;
    the old holder's complete then raises LeaseLost and writes nothing."""
    with idem_store.transaction() as conn:
        first = idem_store.claim(conn, scope="s", operation="op", key="k", request=REQ, lease=timedelta(seconds=0.5))
    assert isinstance(first, Claimed) and first.leased
    with idem_store.transaction() as conn:
        busy = idem_store.claim(conn, scope="s", operation="op", key="k", request=REQ, lease=timedelta(seconds=30))
    assert isinstance(busy, InFlight) and 0 < busy.retry_after <= 0.5
    with pytest.raises(RequestInFlight) as err:
        idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: 1,
                       lease=timedelta(seconds=30))
    assert err.value.retry_after > 0 and err.value.http_status == 409
    import time

    time.sleep(0.6)
    with idem_store.transaction() as conn:
        second = idem_store.claim(conn, scope="s", operation="op", key="k", request=REQ, lease=timedelta(seconds=30))
    assert isinstance(second, Claimed) and second.taken_over and second.token != first.token
    with pytest.raises(LeaseLost), idem_store.transaction() as conn:
        idem_store.complete(conn, first, "stale")
    with idem_store.transaction() as conn:
        idem_store.complete(conn, second, "fresh")
    result = idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "never")
    assert (result.response, result.replayed) == ("fresh", True)


@pytest.mark.idem_stack
def test_leased_run_completes_and_replays(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """run(lease=...) claims in its own transaction, then commits effect and result together; retries replay."""
    first = idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=idem_effects.effect("k"),
                      lease=timedelta(seconds=30))
    again = idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=idem_effects.effect("k"),
                      lease=timedelta(seconds=30))
    assert not first.replayed and again.replayed and again.response == first.response
    assert idem_effects.count("k") == 1


def test_leased_run_failure_releases_claim(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """A leased run whose effect fails releases its claim, so the retry runs at once instead of getting 409."""

    def boom(conn: Any) -> Any:
        raise RuntimeError("external call failed")

    with pytest.raises(RuntimeError):
        idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=boom, lease=timedelta(seconds=60))
    result = idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=idem_effects.effect("k"),
                       lease=timedelta(seconds=60))
    assert not result.replayed and idem_effects.count("k") == 1


@pytest.mark.idem_stack
def test_processed_message_accepted_once(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """accept_message is True once per (subscriber, message_id); redelivery is False; other subscribers get it."""
    seen = []
    for subscriber in ["projection", "projection", "audit"]:
        with idem_store.transaction() as conn:
            accepted = idem_store.accept_message(conn, subscriber=subscriber, message_id="m-1", payload={"credit": 50})
            if accepted:
                idem_effects.apply(conn, subscriber)
            seen.append(accepted)
    assert seen == [True, False, True]
    assert idem_effects.per_key() == {"projection": 1, "audit": 1}


def test_processed_message_payload_mismatch(idem_store: IdempotencyStore) -> None:
    """A redelivered message id with a different payload raises RequestMismatch; bytes payloads compare exactly."""
    with idem_store.transaction() as conn:
        assert idem_store.accept_message(conn, subscriber="sub", message_id="m", payload=b"\x00body")
    with pytest.raises(RequestMismatch), idem_store.transaction() as conn:
        idem_store.accept_message(conn, subscriber="sub", message_id="m", payload=b"\x00bodY")
    with idem_store.transaction() as conn:
        assert idem_store.accept_message(conn, subscriber="sub", message_id="m", payload=b"\x00body") is False


def test_message_rolled_back_with_effect(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """A message accepted in a transaction that rolls back is not recorded: redelivery is accepted again."""
    with pytest.raises(RuntimeError), idem_store.transaction() as conn:
        assert idem_store.accept_message(conn, subscriber="sub", message_id="m")
        idem_effects.apply(conn, "sub")
        raise RuntimeError("handler failed")
    with idem_store.transaction() as conn:
        assert idem_store.accept_message(conn, subscriber="sub", message_id="m")
        idem_effects.apply(conn, "sub")
    assert idem_effects.count("sub") == 1


@pytest.mark.idem_stack
def test_purge_removes_old_keeps_live(idem_store: IdempotencyStore) -> None:
    """purge deletes completed records and messages older than the window, in batches; live claims survive."""
    for i in range(7):
        idem_store.run(scope="s", operation="op", key=f"done-{i}", request=REQ, effect=returning(i))
    with idem_store.transaction() as conn:
        idem_store.claim(conn, scope="s", operation="op", key="live", request=REQ, lease=timedelta(hours=1))
        idem_store.accept_message(conn, subscriber="sub", message_id="m")
    assert idem_store.purge(older_than=timedelta(hours=1), batch_size=3) == 0  # nothing is old yet
    deleted = idem_store.purge(older_than=timedelta(0), batch_size=3)
    assert deleted == 8  # 7 records in batches of 3, plus the message
    with idem_store.engine.connect() as conn:
        keys = [r.idem_key for r in conn.execute(select(idem_store.tables.records))]
    assert keys == ["live"]
    with idem_store.transaction() as conn:
        busy = idem_store.claim(conn, scope="s", operation="op", key="live", request=REQ, lease=timedelta(hours=1))
    assert isinstance(busy, InFlight)
