"""Measure a Patroni failover's window as callers of `run` see it (docs: Clusters and failover, "failover budgets").

Starts the `postgresql-patroni` stack with Patroni's default timing (ttl 30, loop_wait 10, retry_timeout 10) or the
catalogue's tuned one (ttl 10, loop_wait 1, retry_timeout 3), runs `store.run` from 8 threads with a retry budget far
longer than any failover (120 s), kills the leader's Patroni and postmaster (SIGKILL), and reports the longest time
without an acknowledgement from the kill on, and the longest single `run` call (what `RetryPolicy.total` must
cover for no caller to get RetriesExhausted). ``.venv/bin/python tools/failover_window.py default|tuned [RUNS]``.
"""

from __future__ import annotations

import sys

from failover_load import window_under_load  # tools/, beside this script

from idem_dialects import IdempotencyStore, RetryPolicy
from idem_dialects.engines.patroni import DEFAULT_TIMING, LOOP_WAIT, RETRY_TIMEOUT, TTL, patroni_cluster

TIMINGS = {"default": DEFAULT_TIMING, "tuned": (TTL, LOOP_WAIT, RETRY_TIMEOUT)}


def measure(timing: tuple[int, int, int]) -> dict[str, float]:
    cluster = patroni_cluster(timing=timing)
    try:
        store = IdempotencyStore.from_url(cluster.url(), table_prefix="fw_", retry=RetryPolicy(total=120),
                                          pool_size=8, max_overflow=0)
        store.create_tables()
        found = window_under_load(store, cluster.kill, lambda killed_at, acked_at: cluster.await_failover())
        return {**found, "elected_in": round(cluster.elected_in or 0.0, 1)}
    finally:
        cluster.stop()


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "default"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    for _ in range(runs):
        print(name, TIMINGS[name], measure(TIMINGS[name]), flush=True)


if __name__ == "__main__":
    main()
