"""Measure what a PostgreSQL crash behind PgBouncer costs callers of `run` (docs: Clusters and failover).

Starts the `pgbouncer-transaction` stack, runs `store.run` from 8 threads through PgBouncer with a retry budget
longer than any outage (120 s), SIGKILLs the PostgreSQL server 3 s in and starts it again 5 s later (crash recovery),
and reports the longest time without an acknowledgement from the kill on, and the longest single `run` call. After a
failed login PgBouncer waits `server_login_retry` seconds (15 by default) before it tries the server again, so the
window is the crash plus up to that wait: ``.venv/bin/python tools/pgbouncer_window.py [SERVER_LOGIN_RETRY] [RUNS]``
(no value: PgBouncer's default).
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from failover_load import window_under_load  # tools/, beside this script

from idem_dialects import IdempotencyStore, RetryPolicy
from idem_dialects.engines.catalogue import get
from idem_dialects.engines.pgbouncer import PooledServer, pgbouncer_transaction

DOWN = 5.0  # seconds the server stays down


def measure(login_retry: int | None) -> dict[str, float]:
    server = pgbouncer_transaction(get("pgbouncer-transaction"))
    stack: PooledServer = server.stop.__self__  # type: ignore[attr-defined]  # the stack the Server stops
    try:
        if login_retry is not None:
            ini = stack.root / "pgbouncer.ini"
            ini.write_text(ini.read_text() + f"server_login_retry = {login_retry}\n")
            assert stack.proc is not None
            stack.proc.send_signal(signal.SIGHUP)  # PgBouncer reloads its configuration
            time.sleep(0.5)
        store = IdempotencyStore.from_url(server.url, table_prefix="pbw_", retry=RetryPolicy(total=120),
                                          pool_size=8, max_overflow=0)
        store.create_tables()
        restarted = threading.Event()

        def kill() -> None:
            stack.server.kill()

            def restart() -> None:
                time.sleep(DOWN)
                stack.server.run()
                restarted.set()
            threading.Thread(target=restart).start()

        def recovered(killed_at: float, acked_at: list[float]) -> None:
            restarted.wait()
            while not acked_at or acked_at[-1] < killed_at + DOWN:
                time.sleep(0.1)

        return window_under_load(store, kill, recovered)
    finally:
        server.stop()


def main() -> None:
    login_retry = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "default" else None
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    for _ in range(runs):
        print(f"server_login_retry={login_retry or 'default (15)'}: PostgreSQL down {DOWN:g} s:",
              measure(login_retry), flush=True)


if __name__ == "__main__":
    main()
