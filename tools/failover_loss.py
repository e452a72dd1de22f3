"""Measure what a PostgreSQL failover does to acknowledged keys (the table in README "Clusters").

For each mode (synchronous or asynchronous standby, with or without replication lag) it starts the `postgresql-ha`
engine's primary + standby, runs `store.run` from 8 threads, pauses the primary's WAL sender (SIGSTOP) to make
lag when asked, kills the primary (SIGKILL), promotes the standby, then re-sends every acknowledged key: a key
whose record survived replays its response; a lost one runs its effect again and answers differently.
Run as root or as a user that can run PostgreSQL: ``.venv/bin/python tools/failover_loss.py [SECONDS]``.
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
from idem_dialects.engines.catalogue import get
from idem_dialects.engines.pg_ha import PgFailoverPair, _query, postgresql_ha

REQ = {"amount": 1}


def measure(synchronous: bool, lag: float) -> dict[str, Any]:
    server = postgresql_ha(get("postgresql-ha"), synchronous=synchronous)
    pair = server.controls
    assert isinstance(pair, PgFailoverPair)
    try:
        store = IdempotencyStore.from_url(server.url, table_prefix="fo_", retry=RetryPolicy(total=60),
                                          pool_size=8, max_overflow=0)
        store.create_tables()
        effects = Effects(store)
        effects.create()
        acked: dict[str, Any] = {}
        stop = threading.Event()
        lock = threading.Lock()

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

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        sender = None
        if lag:
            # Pause the primary's WAL sender: WAL then stays on the primary only (pausing the standby's receiver
            # would not do: what the sender wrote waits in the receiver's socket buffer and survives the kill).
            sender = int(str(_query(pair.primary.port, "SELECT pid FROM pg_stat_replication")[0][0]))
            os.kill(sender, signal.SIGSTOP)
            time.sleep(lag)
        with lock:
            acked_at_kill = len(acked)
        pair.kill()  # the paused sender dies with the primary's process group
        pair.promote()
        time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join()
        store.engine.dispose()
        lost = 0
        for key, response in acked.items():
            again = store.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key))
            lost += again.response != response
        doubled = sum(n > 1 for n in effects.per_key().values())
        store.engine.dispose()
        return {"acked before the kill": acked_at_kill, "acked in total": len(acked), "lost": lost,
                "doubled in the database": doubled}
    finally:
        server.stop()


def main() -> None:
    lag = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    print("| standby | replication lag at the kill | keys acknowledged before the kill | acknowledged keys lost |"
          " keys with 2 effects |")
    print("|---|---|---|---|---|")
    for synchronous, pause in ((False, 0.0), (False, lag), (True, 0.0), (True, lag)):
        found = measure(synchronous, pause)
        mode = "synchronous (`synchronous_commit = on`)" if synchronous else "asynchronous"
        print(f"| {mode} | {'none' if not pause else f'{pause:.0f} s (WAL sender paused)'} |"
              f" {found['acked before the kill']} | {found['lost']} | {found['doubled in the database']} |",
              flush=True)


if __name__ == "__main__":
    main()
