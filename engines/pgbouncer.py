"""`pgbouncer-transaction`: PgBouncer (Debian's `pgbouncer`) in ``pool_mode = transaction`` in front of a PostgreSQL
server of the local binaries, both on loopback ports in one temp dir.

In transaction mode a client holds a server connection only for one transaction: the next transaction of the same
client may run on another server session, so nothing may outlive a transaction on the server side (prepared
statements above all: psycopg prepares a statement after 5 executions, asyncpg and SQLAlchemy's asyncpg dialect
prepare every one). The engine's URL therefore says ``?pooler=transaction``, which the PostgreSQL backend consumes:
it turns those prepared statements off on every driver (see idem_dialects/dialects/options.py). PgBouncer refuses
to run as root; as root it runs, like the server, as the `postgres` system user.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import URL

from .entry import CatalogueEntry, Server, Unavailable
from .local import chown_tree, free_ports, log_tail, spawn, start_cluster, stop_group, wait_until
from .pgserver import PgServer, bindir, query

PGBOUNCER = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
# Server connections per database/user pair: fewer than the 8 workers of tests/test_pooler.py (and the 16 threads
# some checks race), so PgBouncer really multiplexes and a client's next transaction lands on another server session
# (without ?pooler=transaction 411 of 3,200 runs failed here on prepared statements); enough for what a check holds
# open at once.
POOL_SIZE = 4


def _pgbouncer() -> Path:
    found = next((Path(p) for p in PGBOUNCER if Path(p).exists()), None)
    if found is None:
        raise Unavailable("no pgbouncer binary (" + ", ".join(PGBOUNCER) + ")")
    return found


@dataclass
class PooledServer:
    root: Path
    user: str | None
    bin: Path
    pgbouncer: Path
    server: PgServer = field(init=False)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started_in: float = 0.0

    def __post_init__(self) -> None:
        pg_port, self.port = free_ports(2)
        self.server = PgServer(pg_port, self.bin, self.user, datadir=self.root / "data")

    @property
    def log(self) -> Path:
        return self.root / "pgbouncer.log"

    def start(self) -> None:
        started = time.monotonic()
        self.server.start("max_connections=100")
        ini = self.root / "pgbouncer.ini"
        (self.root / "userlist.txt").write_text('"postgres" ""\n')
        ini.write_text(f"""[databases]
* = host=127.0.0.1 port={self.server.port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.root / "userlist.txt"}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 1000
logfile = {self.log}
pidfile = {self.root / "pgbouncer.pid"}
""")
        chown_tree(self.root, self.user)
        self.proc = spawn([str(self.pgbouncer), str(ini)], self.root / "pgbouncer.out", self.user, ports=(self.port,))
        wait_until(lambda: bool(query(self.port, "SELECT 1")), 30, "PgBouncer did not start", self.gone)
        self.started_in = time.monotonic() - started

    def gone(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"pgbouncer exited with {self.proc.returncode}: {log_tail(self.log)}"
        return self.server.alive()

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, sig=signal.SIGINT)  # SIGINT: "safe shutdown" would wait for clients
        self.server.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def pgbouncer_transaction(entry: CatalogueEntry) -> Server:
    pgbouncer, bin_dir = _pgbouncer(), bindir()
    stack = start_cluster(lambda root, user: PooledServer(root, user, bin_dir, pgbouncer), prefix="idem-pgbouncer-",
                          user="postgres", driver=("psycopg", "psycopg", "postgresql"))
    # PgBouncer's own timing (server_login_retry 15 s) stretches a server's crash: the window the URL declares covers
    # it (measured with tools/pgbouncer_window.py; docs: Clusters and failover).
    window = {} if entry.failover_window is None else {"failover_window": f"{entry.failover_window:g}"}
    url = URL.create("postgresql+psycopg", "postgres", None, "127.0.0.1", stack.port, "postgres",
                     query={"pooler": "transaction", **window})
    how = (f"PgBouncer ({pgbouncer}, pool_mode=transaction, {POOL_SIZE} server connections) on 127.0.0.1:{stack.port}"
           f" in front of PostgreSQL ({bin_dir}) on 127.0.0.1:{stack.server.port}; started in {stack.started_in:.1f} s")
    return Server(entry.name, url, how, stack.stop, gone=stack.gone)
