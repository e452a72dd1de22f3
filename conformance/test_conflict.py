"""Check: `run(..., on_in_flight="conflict")` in atomic mode. Two duplicates released together; the one that claims
first holds its transaction open inside the effect until the other has its answer, which must be RequestInFlight
(with a Retry-After) at once instead of a wait and a replay; exactly one effect lands. Repeated over several keys.
The engine's own lock-timeout / no-wait mechanism does it (the backend's `not_waiting`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from idem_dialects import IdempotencyStore, RequestInFlight, Result

from .plugin import EngineUnderTest
from .support import Effects
from .test_async import async_store
from .test_concurrency import race

REQ = {"amount": 100}
ROUNDS = 5
HOLD = 20.0  # at most this long the first holds its transaction open (a duplicate that waited fails the check)


def _one_of_each(results: list[Any]) -> tuple[Result, RequestInFlight]:
    done = [r for r in results if isinstance(r, Result)]
    busy = [r for r in results if isinstance(r, RequestInFlight)]
    assert len(done) == 1 and len(busy) == 1, f"expected one result and one RequestInFlight, got {results!r}"
    assert not done[0].replayed
    assert busy[0].retry_after > 0  # what HTTP sends as Retry-After
    return done[0], busy[0]


@pytest.mark.idem_stack
@pytest.mark.idem_api("sync")
@pytest.mark.idem_requires("concurrent_connections", "exclusive_claim")
def test_conflict_option_answers_a_concurrent_duplicate_in_flight(
        idem_store: IdempotencyStore, idem_effects: Effects, idem_observe: Callable[[str, object], None]) -> None:
    """With on_in_flight="conflict", a duplicate of a request whose atomic claim is not committed yet gets
    RequestInFlight (with a Retry-After) at once instead of waiting: two duplicates behind a barrier, the first
    holding its transaction open inside the effect, give one result, one in-flight answer and one effect (x5)."""
    busy_seconds: list[float] = []
    for round_no in range(ROUNDS):
        key = f"conflict-{round_no}"
        answered = threading.Event()

        def effect(conn: Any, key: str = key, answered: threading.Event = answered) -> dict[str, str]:
            ref = idem_effects.apply(conn, key)
            answered.wait(HOLD)  # the claim stays uncommitted until the duplicate has its answer
            return {"effect": ref}

        def call(i: int, key: str = key, answered: threading.Event = answered) -> Any:
            started = time.perf_counter()
            try:
                return idem_store.run(scope="s", operation="op", key=key, request=REQ, effect=effect,
                                      on_in_flight="conflict")
            except RequestInFlight as exc:
                busy_seconds.append(time.perf_counter() - started)
                answered.set()
                return exc

        done, _ = _one_of_each(race(2, call))
        assert idem_effects.count(key) == 1
        replay = idem_store.run(scope="s", operation="op", key=key, request=REQ, effect=effect)
        assert replay.replayed and replay.response == done.response
    idem_observe(f"conflict option, {ROUNDS} rounds: slowest in-flight answer (ms)",
                 round(max(busy_seconds) * 1000, 1))


@pytest.mark.idem_stack
@pytest.mark.idem_api("async")
@pytest.mark.idem_requires("concurrent_connections", "exclusive_claim")
def test_async_conflict_option_answers_a_concurrent_duplicate_in_flight(
        idem_engine: EngineUnderTest, idem_observe: Callable[[str, object], None]) -> None:
    """The async store's on_in_flight="conflict": two concurrent duplicate tasks, the first holding its transaction
    open inside the effect, give one result, one RequestInFlight with a Retry-After and one effect (x5)."""

    async def main() -> None:
        async with async_store(idem_engine) as (store, effects):
            for round_no in range(ROUNDS):
                key = f"conflict-{round_no}"
                answered = asyncio.Event()

                async def effect(conn: Any, key: str = key, answered: asyncio.Event = answered) -> dict[str, str]:
                    ref = await effects.apply(conn, key)
                    try:
                        await asyncio.wait_for(answered.wait(), HOLD)
                    except TimeoutError:
                        pass
                    return {"effect": ref}

                async def call(key: str = key, answered: asyncio.Event = answered) -> Any:
                    try:
                        return await store.run(scope="s", operation="op", key=key, request=REQ, effect=effect,
                                               on_in_flight="conflict")
                    except RequestInFlight as exc:
                        answered.set()
                        return exc

                done, _ = _one_of_each(list(await asyncio.gather(call(), call())))
                assert (await effects.per_key()).get(key) == 1
                replay = await store.run(scope="s", operation="op", key=key, request=REQ, effect=effect)
                assert replay.replayed and replay.response == done.response
            idem_observe(f"async conflict option, {ROUNDS} rounds", "one in-flight answer and one effect each")

    asyncio.run(main())
