"""Checks: retryable errors are retried within a bounded budget, counted, and reported with attempts and causes
when the budget runs out; real contention on a held key is waited out or reported, never leaked raw."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from idem_dialects import IdempotencyStore, Replayed, RetriesExhausted, RetryPolicy
from idem_dialects.errors import RetryCause

from .support import Effects

REQ = {"amount": 100}
Observe = Callable[[str, object], None]


def lost_connection() -> OperationalError:
    """What SQLAlchemy raises when the server drops the connection mid-statement (connection_invalidated)."""
    return OperationalError("SELECT 1", {}, ConnectionError("server closed the connection unexpectedly"),
                            connection_invalidated=True)


def test_retry_exhaustion_reports_attempts_and_causes(idem_store: IdempotencyStore, idem_effects: Effects,
                                                      idem_observe: Observe) -> None:
    """When retryable errors outlast the budget, run raises RetriesExhausted with the attempt count, the causes
    tallied per kind and the last error; every attempt rolled back, and the absorbed retries were counted. Both
    bounds hold whatever the machine's load: a budget of attempts gives exactly that many; a budget of time (0.3 s)
    gives as many as fit, ending when the next wait would pass it (how many fit is observed, not required)."""
    calls: list[float] = []

    def effect(conn: Any) -> Any:
        calls.append(time.perf_counter())
        idem_effects.apply(conn, "k")
        raise lost_connection()

    idem_store.run(scope="warm-up", operation="op", key="k", request=REQ, effect=lambda conn: {"warm": True})
    for policy in (RetryPolicy(total=600, initial=0.001, max_wait=0.01, max_attempts=3),
                   RetryPolicy(total=0.3, initial=0.01, max_wait=0.05)):
        calls.clear()
        absorbed = idem_store.retries[RetryCause.CONNECTION]  # before this run, by the warm-up or the first policy
        with pytest.raises(RetriesExhausted) as err:
            idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=effect, retry=policy)
        exhausted = err.value
        if policy.max_attempts is not None:
            assert exhausted.attempts == len(calls) == policy.max_attempts
        else:  # stopped by time: the next wait would have passed the budget (a loaded machine fits fewer attempts)
            assert exhausted.attempts == len(calls) >= 1 and exhausted.elapsed > policy.total - policy.max_wait
        assert exhausted.causes == {RetryCause.CONNECTION: exhausted.attempts}
        assert isinstance(exhausted.last_error, OperationalError) and exhausted.__cause__ is exhausted.last_error
        assert str(exhausted.attempts) in str(exhausted) and RetryCause.CONNECTION in str(exhausted)
        assert idem_store.retries[RetryCause.CONNECTION] - absorbed == exhausted.attempts - 1
        assert idem_effects.count() == 0
        records = idem_store.tables.records
        with idem_store.engine.connect() as conn:
            assert conn.execute(select(records).where(records.c.scope == "s")).first() is None
    idem_observe("0.3 s retry budget: attempts before giving up", exhausted.attempts)


def test_absorbed_retries_are_counted(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """A retryable error that clears up is absorbed by run: the caller gets the one result, the failed attempts
    left nothing behind, and store.retries counts each absorbed retry by cause."""
    failures = [lost_connection(), lost_connection()]

    def effect(conn: Any) -> Any:
        effect_id = idem_effects.apply(conn, "k")
        if failures:
            raise failures.pop()
        return {"effect": effect_id}

    result = idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=effect)
    assert not result.replayed and idem_effects.count("k") == 1
    assert dict(idem_store.retries) == {RetryCause.CONNECTION: 2}


def test_non_retryable_error_is_not_retried(idem_store: IdempotencyStore) -> None:
    """An error the backend does not classify as retryable reaches the caller after exactly one attempt."""
    calls: list[int] = []

    def effect(conn: Any) -> Any:
        calls.append(1)
        raise ValueError("bad input found by the effect")

    with pytest.raises(ValueError, match="bad input"):
        idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=effect)
    assert calls == [1] and sum(idem_store.retries.values()) == 0


@pytest.mark.idem_stack
@pytest.mark.idem_requires("concurrent_connections", "exclusive_claim")  # a waiter waits only on an exclusive claim
def test_held_key_is_waited_out_or_reported(idem_store: IdempotencyStore, idem_effects: Effects,
                                            idem_observe: Observe) -> None:
    """A key held by another open transaction for 1 s, against a 0.3 s retry budget: run waits and replays the
    holder's result, or raises RetriesExhausted naming real causes - never a raw driver error, never 2 effects."""
    claimed = threading.Event()
    release = threading.Event()
    problems: list[BaseException] = []

    def holder() -> None:
        try:
            with idem_store.transaction() as conn:
                outcome = idem_store.claim(conn, scope="s", operation="op", key="k", request=REQ)
                claimed.set()
                assert not isinstance(outcome, Replayed)
                response = {"effect": idem_effects.apply(conn, "k")}
                release.wait(1.0)
                idem_store.complete(conn, outcome, response)  # type: ignore[arg-type]
        except BaseException as exc:
            problems.append(exc)
            claimed.set()

    thread = threading.Thread(target=holder)
    thread.start()
    assert claimed.wait(30)
    started = time.perf_counter()
    try:
        result = idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=idem_effects.effect("k"),
                           retry=RetryPolicy(total=0.3))
    except RetriesExhausted as exc:
        waited = time.perf_counter() - started
        assert exc.attempts >= 1 and exc.causes and "unknown" not in exc.causes, exc
        tally = ", ".join(f"{cause} x{n}" for cause, n in sorted(exc.causes.items()))
        idem_observe("key held 1 s, 0.3 s budget", f"RetriesExhausted after {waited:.1f}s ({tally})")
    else:
        waited = time.perf_counter() - started
        assert result.replayed, "the waiter ran its own effect while the holder's claim was open"
        retried = ", ".join(f"{c} x{n}" for c, n in sorted(idem_store.retries.items())) or "no retries"
        idem_observe("key held 1 s, 0.3 s budget", f"waited {waited:.1f}s, then replayed ({retried})")
    finally:
        release.set()
        thread.join(30)
    assert problems == []
    assert idem_effects.count("k") == 1
