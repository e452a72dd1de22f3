"""Check: a leased async run cancelled at any point leaves its key free for the next attempt at once.

A leased claim commits on its own before the effect runs; a task cancelled around that COMMIT (whose outcome it
never learns) or anywhere after it must release what may be its claim, or every retry gets RequestInFlight until
the lease ends. The cancellations land at random points of the run: no hook picks them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from idem_dialects import RequestInFlight

from .plugin import EngineUnderTest
from .test_async import REQ, Observe, async_only, async_store, checked_out

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

CANCELLATIONS = 80
LEASE = timedelta(seconds=60)  # how long a claim the cancelled run left behind would hold its key


@pytest.mark.idem_stack
@async_only
def test_async_cancelled_leased_run_frees_its_key(idem_engine: EngineUnderTest, idem_observe: Observe) -> None:
    """80 leased runs, each cancelled after a random delay within a run's duration (around the claim, its COMMIT,
    the effect or the complete): every key is claimed again by a retry while most of its lease is left (the cancelled
    run freed it, not the lease running out), and each key's effect is in the database once."""

    async def main() -> None:
        async with async_store(idem_engine) as (store, effects):
            loop = asyncio.get_running_loop()
            rng = random.Random(f"{idem_engine.name}-cancel")

            def run(key: str) -> Any:
                async def effect(conn: AsyncConnection) -> Any:
                    return {"effect": await effects.apply(conn, key)}

                return store.run(scope="s", operation="op", key=key, request=REQ, effect=effect, lease=LEASE)

            began = loop.time()
            for i in range(3):  # warm the pool; how long an uncontended leased run takes here
                await run(f"warm{i}")
            span = (loop.time() - began) / 3
            cancelled = waited = 0
            slowest = 0.0
            for i in range(CANCELLATIONS):
                key = f"c{i}"
                task = asyncio.create_task(run(key))
                await asyncio.sleep(rng.uniform(0, span * 1.2))
                task.cancel()
                cancelled_at = loop.time()
                try:
                    await task
                except asyncio.CancelledError:
                    cancelled += 1
                while True:
                    try:
                        await run(key)
                        break
                    except RequestInFlight as busy:
                        waited += 1
                        # The database's clock says how much of the lease is left: half of it is far longer than a
                        # cancelled run's cleanup takes on a machine however loaded.
                        assert busy.retry_after > LEASE.total_seconds() / 2, \
                            f"key {key} still held {loop.time() - cancelled_at:.2f}s after its run was cancelled:" \
                            " only its lease would free it"
                        await asyncio.sleep(0.02)
                slowest = max(slowest, loop.time() - cancelled_at)
            assert cancelled, "no run was cancelled: the check did not test cancellation"
            per_key = await effects.per_key()
            wrong = {f"c{i}": per_key.get(f"c{i}", 0) for i in range(CANCELLATIONS) if per_key.get(f"c{i}") != 1}
            assert not wrong, f"effects per key, where not once: {wrong}"
            assert checked_out(store) == 0, "a cancelled run kept a connection checked out"
            idem_observe("cancelled leased runs", f"{cancelled} of {CANCELLATIONS} cancelled mid-run; every key"
                                                  f" claimable again within {slowest:.3f}s ({waited} retries got"
                                                  " 409 first)")

    asyncio.run(main())


@pytest.mark.idem_stack
@async_only
def test_async_cancelled_runs_leave_no_error_in_the_pools_log(idem_engine: EngineUnderTest,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """100 atomic runs, each cancelled at a random point (in the claim, the effect, the COMMIT): the connection a
    statement was cut off on is discarded without a ROLLBACK tried on it, so SQLAlchemy's pool logs no "Exception
    during reset" ERROR, every connection goes back, and each key's effect is there at most once."""

    async def main() -> None:
        async with async_store(idem_engine) as (store, effects):
            loop = asyncio.get_running_loop()
            rng = random.Random(f"{idem_engine.name}-cancel-atomic")

            def run(key: str) -> Any:
                async def effect(conn: AsyncConnection) -> Any:
                    return {"effect": await effects.apply(conn, key)}

                return store.run(scope="s", operation="op", key=key, request=REQ, effect=effect)

            began = loop.time()
            for i in range(3):
                await run(f"warm{i}")
            span = (loop.time() - began) / 3
            for i in range(100):
                task = asyncio.create_task(run(f"a{i}"))
                await asyncio.sleep(rng.uniform(0, span * 1.2))
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert checked_out(store) == 0, "a cancelled run kept a connection checked out"
            assert all(n == 1 for n in (await effects.per_key()).values())

    with caplog.at_level(logging.WARNING, logger="sqlalchemy"):
        asyncio.run(main())
    logged = [f"{r.name}: {r.getMessage()}" for r in caplog.records
              if r.name.startswith("sqlalchemy") and r.levelno >= logging.ERROR]
    assert logged == [], logged
