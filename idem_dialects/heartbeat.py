"""The timers that renew a leased claim while its effect runs: a daemon thread for the sync loop, a task for the
async one. What a beat does (the fenced renewal, what it logs, when to stop) is the `Heartbeat` flow from
`claims.py`, written once; each loop wraps the effect in `beating(...)` / `beating_async(...)`.

Both stop before the effect's outcome goes on (its value or its exception, unchanged): a renewal in progress is
waited for (sync) or cancelled and awaited (async), so no renewal runs after the effect has returned.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
    nullcontext,
)

from .steps import Flow, Heartbeat

log = logging.getLogger("idem_dialects")


# Most effects have no heartbeat (atomic runs): they get this, costing no generator per effect.
_NO_BEAT = nullcontext()


def beating(heartbeat: Heartbeat | None,
            drive: Callable[[Flow[bool]], bool]) -> AbstractContextManager[None]:
    """Run `heartbeat`'s beats on a daemon thread (each driven by the sync store's `drive`) around the block."""
    return _NO_BEAT if heartbeat is None else _beating(heartbeat, drive)


def beating_async(heartbeat: Heartbeat | None,
                  drive: Callable[[Flow[bool]], Awaitable[bool]]) -> AbstractAsyncContextManager[None]:
    """Run `heartbeat`'s beats in a task (each awaited through the async store's `drive`) around the block."""
    return _NO_BEAT if heartbeat is None else _beating_async(heartbeat, drive)


@contextmanager
def _beating(heartbeat: Heartbeat, drive: Callable[[Flow[bool]], bool]) -> Iterator[None]:
    stop = threading.Event()

    def loop() -> None:
        try:
            while not stop.wait(heartbeat.interval):
                if not drive(heartbeat.beat()):
                    return
        except Exception as exc:  # the beat flow logs its own failures; this is the loop's, never the effect's
            log.warning("the lease heartbeat stopped: %s", type(exc).__name__)

    thread = threading.Thread(target=loop, name="idem-dialects-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()  # at most one short renewal in progress


@asynccontextmanager
async def _beating_async(heartbeat: Heartbeat, drive: Callable[[Flow[bool]], Awaitable[bool]]) -> AsyncIterator[None]:
    async def loop() -> None:
        try:
            while True:
                await asyncio.sleep(heartbeat.interval)
                if not await drive(heartbeat.beat()):
                    return
        except Exception as exc:
            log.warning("the lease heartbeat stopped: %s", type(exc).__name__)

    task = asyncio.create_task(loop(), name="idem-dialects-heartbeat")
    try:
        yield
    finally:
        task.cancel()  # a renewal cancelled midway rolls back: the lease it would extend no longer matters
        await asyncio.wait({task})
