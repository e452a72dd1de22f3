"""Checks: same-key races that really race (threads behind a barrier, processes), failing winners, isolation
levels, and a duplicate claim inside a caller's own transaction."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import DBAPIError

from idem_dialects import Claimed, IdempotencyStore, Replayed, RequestInFlight, Result
from idem_dialects.conformance import support

from .plugin import EngineUnderTest
from .support import Effects, effects_table

REQ = {"amount": 100}


def race(n: int, call: Callable[[int], Any]) -> list[Any]:
    """Start `n` calls at the same instant (a barrier) on `n` threads; return each result or exception."""
    barrier = threading.Barrier(n)

    def one(i: int) -> Any:
        barrier.wait()
        try:
            return call(i)
        except Exception as exc:  # collected, so the check can say which callers saw an error
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def assert_exactly_once(results: list[Any], effects: Effects, key: str) -> None:
    errors = [r for r in results if not isinstance(r, Result)]
    assert errors == [], f"errors leaked to callers of run: {errors!r}"
    assert effects.count(key) == 1
    assert len({repr(r.response) for r in results}) == 1, "callers got different responses"
    assert sum(not r.replayed for r in results) == 1


def _same_key_race(store: IdempotencyStore, effects: Effects, observe: Callable[[str, object], None],
                   threads: int, rounds: int, label: str) -> None:
    waits: list[float] = []
    for round_no in range(rounds):
        key = f"race-{round_no}"

        def call(i: int, key: str = key) -> Result:
            started = time.perf_counter()
            result = store.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key))
            waits.append(time.perf_counter() - started)
            return result

        assert_exactly_once(race(threads, call), effects, key)
    waits.sort()
    observe(f"{label}: slowest caller (ms)", round(waits[-1] * 1000, 1))
    observe(f"{label}: median caller (ms)", round(waits[len(waits) // 2] * 1000, 1))
    observe(f"{label}: retries absorbed", dict(store.retries) or "none")
    how = "losers waited on the key, then replayed" if not store.retries else (
        "losers retried after " + ", ".join(f"{c} x{n}" for c, n in sorted(store.retries.items())) + ", then replayed")
    observe(f"{label}: duplicates resolved by", how)


@pytest.mark.idem_stack
@pytest.mark.idem_requires("concurrent_connections")
def test_same_key_thread_race(idem_store: IdempotencyStore, idem_effects: Effects,
                              idem_observe: Callable[[str, object], None]) -> None:
    """16 threads released together on one key: exactly one effect, identical responses, 15 replays (x5 rounds)."""
    _same_key_race(idem_store, idem_effects, idem_observe, threads=16, rounds=5, label="16-thread race")


@pytest.mark.idem_stack
@pytest.mark.idem_requires("concurrent_connections")
def test_same_key_race_under_isolation(idem_make_store: Callable[..., IdempotencyStore], idem_isolation_level: str,
                                       idem_engine: EngineUnderTest,
                                       idem_observe: Callable[[str, object], None]) -> None:
    """The 16-thread race gives exactly one effect under each isolation level the backend declares (x3 rounds)."""
    level = idem_isolation_level  # one variant per declared level (the plugin parametrizes them per engine)
    if level not in idem_engine.features.isolation_levels:
        pytest.skip(f"{idem_engine.backend} declares {level}, but this server does not offer it"
                    f" (offers {', '.join(idem_engine.features.isolation_levels)})")
    store = idem_make_store(isolation_level=level)
    with effects_table(store) as effects:
        _same_key_race(store, effects, idem_observe, threads=16, rounds=3, label=level)


@pytest.mark.idem_stack
@pytest.mark.idem_requires("concurrent_connections", "exclusive_claim")  # losers queue only behind an exclusive claim
def test_failing_winner_with_queued_losers(idem_store: IdempotencyStore, idem_effects: Effects,
                                           idem_observe: Callable[[str, object], None]) -> None:
    """The first effect fails after 7 others queued on the key: one of them takes over, exactly one effect lands,
    only the failing caller sees the error, and the rest get identical responses."""
    first = threading.Event()
    lock = threading.Lock()

    def effect(conn: Any) -> Any:
        with lock:
            failing = not first.is_set()
            first.set()
        if failing:
            time.sleep(0.3)  # let the others queue behind this uncommitted claim
            raise RuntimeError("winner failed")
        return {"effect": idem_effects.apply(conn, "k")}

    results = race(8, lambda i: idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=effect))
    failures = [r for r in results if isinstance(r, Exception)]
    assert [str(f) for f in failures] == ["winner failed"]
    assert_exactly_once([r for r in results if isinstance(r, Result)], idem_effects, "k")
    idem_observe("failing winner: callers that saw its error", len(failures))


@pytest.mark.idem_stack
@pytest.mark.idem_requires("concurrent_connections")
def test_leased_same_key_race(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """8 leased runs on one key: one runs the effect; the others replay it or get RequestInFlight, never a 2nd
    effect."""

    def call(i: int) -> Any:
        return idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=idem_effects.effect("k"),
                         lease=timedelta(seconds=30))

    results = race(8, call)
    assert all(isinstance(r, (Result, RequestInFlight)) for r in results), results
    assert sum(isinstance(r, Result) and not r.replayed for r in results) == 1
    assert idem_effects.count("k") == 1


@pytest.mark.idem_stack
@pytest.mark.idem_requires("processes")
def test_processes_share_keys(idem_store: IdempotencyStore, idem_effects: Effects,
                              idem_observe: Callable[[str, object], None]) -> None:
    """4 processes run the same 200 keys in different orders: exactly one effect per key, one response per key."""
    keys = [f"p-{i}" for i in range(200)]
    ctx = support.fresh_processes()
    out = ctx.Queue()
    url = idem_store.engine.url.render_as_string(hide_password=False)
    # The worker is named by its installed module path, which a fresh interpreter can always import (a test
    # module collected by path may carry a name only the collecting process knows).
    procs = [ctx.Process(target=support.process_worker, args=(url, idem_store.table_prefix, list(keys), seed, out))
             for seed in range(4)]
    reports: list[tuple[dict[str, str], dict[str, int]]] = support.run_processes(procs, out)
    assert idem_effects.per_key() == {k: 1 for k in keys}
    for key in keys:
        assert len({responses[key] for responses, _ in reports}) == 1, f"processes disagree on {key}"
    retries: dict[str, int] = {}
    for _, counts in reports:
        for cause, n in counts.items():
            retries[cause] = retries.get(cause, 0) + n
    idem_observe("4 processes x 200 keys: retries absorbed", retries or "none")


@pytest.mark.idem_stack
def test_duplicate_claim_keeps_transaction_usable(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """A claim that hits an existing record inside the caller's transaction leaves it usable: statements before
    and after the claim commit together."""
    idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "first")
    with idem_store.transaction() as conn:
        idem_effects.apply(conn, "before")
        outcome = idem_store.claim(conn, scope="s", operation="op", key="k", request=REQ)
        assert isinstance(outcome, Replayed) and outcome.response == "first"
        idem_effects.apply(conn, "after")
        conn.execute(insert(idem_effects.table).values(id="x" * 32, k="after", amount=2))
    assert idem_effects.per_key() == {"before": 1, "after": 2}


@pytest.mark.idem_stack
@pytest.mark.idem_requires("concurrent_connections")
def test_claim_after_earlier_read_sees_winner(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """A transaction that read before the winner committed still sees the winner when it claims (no stale
    snapshot hides it): it replays or gets a retryable error that run absorbs - never a second effect (where claims
    are not exclusive before commit, the claim may succeed and its commit fails retryably instead)."""
    with idem_store.engine.connect() as reader:
        tx = reader.begin()
        reader.execute(select(idem_store.tables.records)).all()  # establishes a snapshot on MVCC engines
        idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=idem_effects.effect("k"))
        try:
            outcome = idem_store.claim(reader, scope="s", operation="op", key="k", request=REQ)
            if isinstance(outcome, Claimed) and not idem_store.features.exclusive_claim:
                # A multi-primary node (Galera) waits for other nodes' commits only at a transaction's first
                # statement, so this claim may not see the winner yet; certification then rejects its commit.
                idem_store.complete(reader, outcome, {"effect": idem_effects.apply(reader, "k")})
                with pytest.raises(DBAPIError) as rejected:
                    tx.commit()
                assert idem_store.retry_cause(rejected.value) is not None, f"not retryable: {rejected.value!r}"
            else:
                assert isinstance(outcome, Replayed)
        except Exception as exc:
            assert idem_store.retry_cause(exc) is not None, f"not retryable: {exc!r}"
        finally:
            if tx.is_active:
                tx.rollback()
    again = idem_store.run(scope="s", operation="op", key="k", request=REQ, effect=idem_effects.effect("k"))
    assert again.replayed and idem_effects.count("k") == 1
