"""The load both failover-window tools run: 8 threads of first-time `store.run` calls, a kill 3 s in, and what the
callers saw of it (the longest time without an acknowledgement from the kill on, the longest single call)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from idem_dialects import IdempotencyStore
from idem_dialects.conformance.test_cluster import outage


def window_under_load(store: IdempotencyStore, kill: Callable[[], None],
                      recovered: Callable[[float, list[float]], None]) -> dict[str, float]:
    """`kill()` the stack 3 s into the load, `recovered(killed_at, acked_at)` waits until it serves again, then 3 s
    more of load; returns the window, the longest call and the errors (with a retry budget longer than any failover,
    every one of them is a caller's loss)."""
    acked_at: list[float] = []
    longest = [0.0]
    errors: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def worker(t: int) -> None:
        i = 0
        while not stop.is_set():
            started = time.monotonic()
            i += 1
            try:
                store.run(scope="s", operation="op", key=f"k-{t}-{i}", request={}, effect=lambda c: 1)
            except Exception as exc:
                errors.append(type(exc).__name__)
                continue
            with lock:
                acked_at.append(time.monotonic())
                longest[0] = max(longest[0], time.monotonic() - started)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(3.0)
    killed_at = time.monotonic()
    kill()
    recovered(killed_at, acked_at)
    time.sleep(3.0)
    stop.set()
    for thread in threads:
        thread.join()
    store.engine.dispose()
    return {"window": round(outage(killed_at, acked_at), 1), "longest_call": round(longest[0], 1),
            "errors": float(len(errors))}
