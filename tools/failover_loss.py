"""Measure what a Patroni failover does to acknowledged keys (the table in README "Clusters").

For each mode (synchronous mode or an asynchronous replica, with or without replication lag) it starts the
`postgresql-patroni` engine's stack (3 etcd members, 2 Patroni nodes), runs `store.run` from 8 threads, pauses the
leader's WAL sender (SIGSTOP) to make lag when asked, kills the leader's Patroni and postmaster (SIGKILL) and lets
Patroni fail over by itself. If Patroni promoted the replica, every acknowledged key is re-sent: a key whose record
survived replays its response, a lost one runs its effect again and answers differently. If Patroni refused
(``maximum_lag_on_failover``), the old leader's Patroni is started again, takes the leader lock back, and the keys
are re-sent then. Run as root or as a user that can run PostgreSQL:
``.venv/bin/python tools/failover_loss.py [SECONDS OF LAG ...]`` (default: 0.3 and 5).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from idem_dialects import IdempotencyStore, RetryPolicy
from idem_dialects.conformance.support import Effects
from idem_dialects.conformance.test_cluster import outage
from idem_dialects.engines.patroni import LOOP_WAIT, TTL, PatroniCluster, patroni_cluster
from idem_dialects.engines.pgserver import query

REQ = {"amount": 1}


def _lag(cluster: PatroniCluster) -> int | str:
    lags = [m.get("lag") for m in cluster.members() if m.get("role") != "leader"]
    return next((lag for lag in lags if lag is not None), "unknown")


def measure(synchronous: bool, pause: float) -> dict[str, Any]:
    cluster = patroni_cluster(synchronous=synchronous)
    try:
        store = IdempotencyStore.from_url(cluster.url(), table_prefix="fo_", retry=RetryPolicy(total=3 * TTL),
                                          pool_size=8, max_overflow=0)
        store.create_tables()
        effects = Effects(store)
        effects.create()
        acked: dict[str, Any] = {}
        stop = threading.Event()
        lock = threading.Lock()
        killed_at: list[float] = []
        acked_at: list[float] = []

        def worker(t: int) -> None:
            i = 0
            while not stop.is_set():
                key = f"k-{t}-{i}"
                i += 1
                try:
                    result = store.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key))
                except Exception:
                    continue
                with lock:
                    acked[key] = result.response
                    acked_at.append(time.monotonic())

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(2.0)
        leader = cluster.leader()
        assert leader is not None
        if pause:
            # Pause the leader's WAL sender: WAL then stays on the leader only. Synchronous mode: commits wait.
            sender = int(str(query(leader.port, "SELECT pid FROM pg_stat_replication")[0][0]))
            os.kill(sender, signal.SIGSTOP)
            time.sleep(pause)
            time.sleep(2 * LOOP_WAIT)  # the leader publishes its position in etcd once per loop
        lag = _lag(cluster)
        with lock:
            acked_at_kill = len(acked)
            killed_at.append(time.monotonic())
        cluster.kill()  # the paused sender dies with the leader's postmaster
        promoted = cluster.elected(2 * TTL + 5 * LOOP_WAIT)
        if not promoted:
            stop.set()
        how = cluster.rejoin()
        time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join()
        store.engine.dispose()
        lost = sum(store.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key)).response
                   != response for key, response in acked.items())
        doubled = sum(n > 1 for n in effects.per_key().values())
        store.engine.dispose()
        return {"lag": lag, "acked": acked_at_kill, "promoted": promoted, "lost": lost, "doubled": doubled,
                "window": round(outage(killed_at[0], acked_at), 1) if promoted else None, "rejoin": how}
    finally:
        cluster.stop()


def main() -> None:
    pauses = [float(a) for a in sys.argv[1:]] or [0.3, 5.0]
    print("| replication | WAL sender paused | replica lag at the kill (bytes) | keys acknowledged before the kill |"
          " Patroni promoted the replica | longest time without an ack after the kill (s) | acknowledged keys lost |"
          " keys with 2 effects |")
    print("|---|---|---|---|---|---|---|---|")
    for synchronous in (True, False):
        for pause in (0.0, *pauses):
            found = measure(synchronous, pause)
            mode = "synchronous mode" if synchronous else "asynchronous"
            promoted = "yes" if found["promoted"] else "no (lag guard): old leader back"
            window = "-" if found["window"] is None else found["window"]
            print(f"| {mode} | {f'{pause:g} s' if pause else 'no'} | {found['lag']} | {found['acked']} | {promoted} |"
                  f" {window} | {found['lost']} | {found['doubled']} |", flush=True)


if __name__ == "__main__":
    main()
