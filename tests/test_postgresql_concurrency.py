"""PostgreSQL under concurrency: what each isolation level gives the step-by-step API (the right outcome, or a
40001 that `run` retries), and the retryable errors that really happen (lost connections, lock timeouts,
deadlocks). Races are ordered by watching pg_blocking_pids, never by sleeping and hoping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from datetime import timedelta
from typing import Any

import pytest
from pg_common import *  # noqa: F403  (fixtures: admin, effects, make_store, pg, store)
from pg_common import LEVELS, REQ, SNAPSHOT_LEVELS, backend_pid, claim_in_transaction, wait_until_blocked
from sqlalchemy import select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from idem_dialects import Claimed, IdempotencyStore, InFlight, Mismatch, Replayed, RetryPolicy
from idem_dialects.conformance.support import Effects
from idem_dialects.dialects.postgresql_errors import sqlstate
from idem_dialects.errors import RetryCause

# --- isolation levels in the step-by-step API ----------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("winner_ends", ["commit", "rollback"])
def test_claim_waiting_on_uncommitted_winner(make_store: Callable[..., IdempotencyStore], admin: Engine,
                                             level: str, winner_ends: str) -> None:
    """A claim that waits on an uncommitted winner gets, once the winner ends: Claimed if it rolled back; if it
    committed, Replayed under READ COMMITTED, and serialization failure (40001, retryable) under REPEATABLE READ
    and SERIALIZABLE, whose snapshot cannot show the winner. Never a wrong outcome, never a second claim."""
    store = make_store(isolation_level=level)
    with store.engine.connect() as winner, store.engine.connect() as loser, ThreadPoolExecutor(1) as pool:
        winner_pid, loser_pid = backend_pid(winner), backend_pid(loser)
        wtx = winner.begin()
        won = store.claim(winner, scope="s", operation="op", key="k", request=REQ)
        assert isinstance(won, Claimed)
        pending: Future[Any] = pool.submit(claim_in_transaction, store, loser)
        try:
            wait_until_blocked(admin, loser_pid, winner_pid)
        finally:
            if winner_ends == "commit":
                store.complete(winner, won, "first", status=201)
                wtx.commit()
            else:
                wtx.rollback()
        if winner_ends == "rollback":
            assert isinstance(pending.result(timeout=30), Claimed)
        elif level in SNAPSHOT_LEVELS:
            with pytest.raises(DBAPIError) as err:
                pending.result(timeout=30)
            assert sqlstate(err.value) == "40001" and store.retry_cause(err.value) == RetryCause.SERIALIZATION
        else:
            outcome = pending.result(timeout=30)
            assert isinstance(outcome, Replayed) and (outcome.response, outcome.status) == ("first", 201)
    # Whatever the loser saw, run at this level settles it: one effect at most, and the right replay.
    again = store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "second")
    assert again.replayed is (winner_ends == "commit")


@pytest.mark.parametrize("level", LEVELS)
def test_claim_with_snapshot_older_than_winner(make_store: Callable[..., IdempotencyStore], effects: Effects,
                                               level: str) -> None:
    """A transaction whose snapshot predates a committed winner (it read first) gets Replayed under READ
    COMMITTED and 40001 under REPEATABLE READ / SERIALIZABLE (ON CONFLICT refuses to skip a row its snapshot
    cannot see); `run` at that level then replays, and the effect ran once."""
    store = make_store(isolation_level=level)
    fx = Effects(store)
    with store.engine.connect() as reader:
        tx = reader.begin()
        reader.execute(select(store.tables.records)).all()  # takes the snapshot
        store.run(scope="s", operation="op", key="k", request=REQ, effect=fx.effect("k"))
        try:
            if level in SNAPSHOT_LEVELS:
                with pytest.raises(DBAPIError) as err:
                    store.claim(reader, scope="s", operation="op", key="k", request=REQ)
                assert store.retry_cause(err.value) == RetryCause.SERIALIZATION
            else:
                assert isinstance(store.claim(reader, scope="s", operation="op", key="k", request=REQ), Replayed)
        finally:
            tx.rollback()
    again = store.run(scope="s", operation="op", key="k", request=REQ, effect=fx.effect("k"))
    assert again.replayed and fx.count("k") == 1


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("change", ["completed", "taken_over"])
def test_claim_after_record_changed_since_snapshot(make_store: Callable[..., IdempotencyStore], level: str,
                                                   change: str) -> None:
    """A leased record the snapshot saw in flight, then completed or taken over by others after the snapshot: READ
    COMMITTED reads the new version (Replayed / InFlight under the new lease); REPEATABLE READ and SERIALIZABLE get
    40001 from ON CONFLICT itself, so the read never returns the stale version (why the read needs no FOR SHARE)."""
    store = make_store(isolation_level=level)
    lease = timedelta(seconds=0.2) if change == "taken_over" else timedelta(minutes=5)
    with store.transaction() as conn:
        first = store.claim(conn, scope="s", operation="op", key="k", request=REQ, lease=lease)
    assert isinstance(first, Claimed)
    if change == "taken_over":
        time.sleep(0.3)  # the lease must be over (a lower bound only: nothing else depends on timing)
    with store.engine.connect() as reader:
        tx = reader.begin()
        reader.execute(select(store.tables.records)).all()  # the snapshot: the record in flight
        with store.transaction() as conn:
            if change == "completed":
                store.complete(conn, first, "done")
            else:
                taken = store.claim(conn, scope="s", operation="op", key="k", request=REQ, lease=timedelta(minutes=5))
                assert isinstance(taken, Claimed) and taken.taken_over
        try:
            if level in SNAPSHOT_LEVELS:
                with pytest.raises(DBAPIError) as err:
                    store.claim(reader, scope="s", operation="op", key="k", request=REQ, lease=timedelta(minutes=5))
                assert sqlstate(err.value) == "40001" and store.retry_cause(err.value) == RetryCause.SERIALIZATION
            else:
                outcome = store.claim(reader, scope="s", operation="op", key="k", request=REQ,
                                      lease=timedelta(minutes=5))
                expected = Replayed if change == "completed" else InFlight
                assert isinstance(outcome, expected), outcome
                if isinstance(outcome, InFlight):
                    assert outcome.retry_after > 60  # the taker's new lease, not the stale expired one
        finally:
            tx.rollback()


@pytest.mark.parametrize("level", LEVELS)
def test_duplicate_claim_keeps_caller_transaction_usable(make_store: Callable[..., IdempotencyStore],
                                                         effects: Effects, level: str) -> None:
    """At every isolation level, claims that find a completed record (Replayed), another request's record
    (Mismatch) or a live lease (InFlight) leave the caller's transaction usable: what it writes before and
    after commits."""
    store = make_store(isolation_level=level)
    fx = Effects(store)
    store.run(scope="s", operation="op", key="done", request=REQ, effect=lambda conn: "first")
    with store.transaction() as conn:
        assert isinstance(store.claim(conn, scope="s", operation="op", key="live", request=REQ,
                                      lease=timedelta(minutes=5)), Claimed)
    with store.transaction() as conn:
        fx.apply(conn, "before")
        assert isinstance(store.claim(conn, scope="s", operation="op", key="done", request=REQ), Replayed)
        assert isinstance(store.claim(conn, scope="s", operation="op", key="done", request={"x": 1}), Mismatch)
        assert isinstance(store.claim(conn, scope="s", operation="op", key="live", request=REQ), InFlight)
        fx.apply(conn, "after")
        assert store.accept_message(conn, subscriber="sub", message_id="m")
        assert not store.accept_message(conn, subscriber="sub", message_id="m")
        fx.apply(conn, "after")
    assert fx.per_key() == {"before": 1, "after": 2}


# --- retryable errors that really happen ---------------------------------------------------------------------------


def test_lost_connection_is_retried_by_run(store: IdempotencyStore, effects: Effects) -> None:
    """A connection killed mid-effect (pg_terminate_backend: SQLSTATE 57P01) is retried by run in a new
    connection; the dead attempt left nothing, so the effect lands exactly once and is not a replay."""
    killed: list[bool] = []

    def effect(conn: Connection) -> Any:
        fx_id = effects.apply(conn, "k")
        if not killed:
            killed.append(True)
            conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        return fx_id

    result = store.run(scope="s", operation="op", key="k", request=REQ, effect=effect)
    assert not result.replayed and effects.count("k") == 1
    assert store.retries[RetryCause.CONNECTION] == 1


def test_lock_timeout_is_retried_by_run(make_store: Callable[..., IdempotencyStore], effects: Effects,
                                        admin: Engine) -> None:
    """A claim that hits lock_timeout (55P03) behind an uncommitted winner is retried by run until the winner
    commits, then replays the winner's response."""
    holder_store = make_store()
    impatient = make_store(connect_args={"options": "-c lock_timeout=50"})
    with holder_store.engine.connect() as holder, ThreadPoolExecutor(1) as pool:
        tx = holder.begin()
        won = holder_store.claim(holder, scope="s", operation="op", key="k", request=REQ)
        assert isinstance(won, Claimed)
        pending = pool.submit(impatient.run, scope="s", operation="op", key="k", request=REQ,
                              effect=effects.effect("k"), retry=RetryPolicy(total=60))
        try:
            deadline = time.monotonic() + 30
            while impatient.retries[RetryCause.LOCK_TIMEOUT] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert impatient.retries[RetryCause.LOCK_TIMEOUT] >= 2
        finally:
            holder_store.complete(holder, won, "holder's")
            tx.commit()
        result = pending.result(timeout=30)
    assert result.replayed and result.response == "holder's" and effects.count("k") == 0


def test_deadlock_victim_is_classified(store: IdempotencyStore, admin: Engine) -> None:
    """Two transactions claiming two keys in opposite orders deadlock; PostgreSQL aborts one (40P01), which is
    classified as a retryable deadlock, and the other then gets its claim."""
    with store.engine.connect() as a, store.engine.connect() as b, ThreadPoolExecutor(2) as pool:
        a_pid, b_pid = backend_pid(a), backend_pid(b)
        a_tx, b_tx = a.begin(), b.begin()
        assert isinstance(store.claim(a, scope="s", operation="op", key="x", request=REQ), Claimed)
        assert isinstance(store.claim(b, scope="s", operation="op", key="y", request=REQ), Claimed)
        a_wants_y = pool.submit(store.claim, a, scope="s", operation="op", key="y", request=REQ)
        wait_until_blocked(admin, a_pid, b_pid)
        b_wants_x = pool.submit(store.claim, b, scope="s", operation="op", key="x", request=REQ)
        outcomes: list[Any] = []
        tx_of = {a_wants_y: a_tx, b_wants_x: b_tx}
        for fut in as_completed(tx_of, timeout=60):
            try:
                outcomes.append(fut.result())
            except DBAPIError as exc:
                outcomes.append(exc)
                tx_of[fut].rollback()  # the victim's transaction is over; end it so nothing waits on it
        for tx in (a_tx, b_tx):
            if tx.is_active:
                tx.rollback()
    victims = [o for o in outcomes if isinstance(o, DBAPIError)]
    assert len(victims) == 1, outcomes
    assert sqlstate(victims[0]) == "40P01" and store.retry_cause(victims[0]) == RetryCause.DEADLOCK
    assert sum(isinstance(o, Claimed) for o in outcomes) == 1
