"""`postgresql-ha`: a PostgreSQL primary and a synchronous streaming standby from the local PostgreSQL binaries.

initdb makes the primary; `pg_basebackup -c fast -R` (a fast checkpoint: otherwise the backup waits for the next
scheduled one) makes the standby, which streams from it. Synchronous replication (`synchronous_standby_names`,
`synchronous_commit = on`) is switched on only once the standby streams - before that every commit would wait for
a standby that is not there. It is set with ALTER SYSTEM on the primary alone, so the standby, once promoted, does
not wait for a standby of its own. As root, both servers run as the `postgres` system user (PostgreSQL refuses
root) in a temp dir it owns. Clients use one multi-host URL with ``target_session_attrs=read-write``: whichever
node takes writes (the primary, or the standby once promoted) is the one they reach.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import URL

from .entry import CatalogueEntry, Server, Unavailable
from .local import LocalNode, chown_tree, free_ports, run_as, spawn, start_cluster, stop_group
from .local import wait_until as _wait_until

BIN_DIRS = (os.environ.get("IDEM_PG_BINDIR", ""), "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin",
            "/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/18/bin")
HINT = "apt-get install postgresql-15 (or set IDEM_PG_BINDIR to a PostgreSQL bin directory with initdb)"


def bindir() -> Path:
    for candidate in BIN_DIRS:
        if candidate and all((Path(candidate) / tool).exists() for tool in ("initdb", "postgres", "pg_basebackup")):
            return Path(candidate)
    raise Unavailable("no PostgreSQL server binaries (initdb, postgres, pg_basebackup) in "
                      + ", ".join(d for d in BIN_DIRS if d))


def _query(port: int, sql: str) -> list[tuple[object, ...]]:
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=2,
                         autocommit=True) as conn:
        cur = conn.execute(sql)  # type: ignore[call-overload, unused-ignore]  # psycopg wants a LiteralString
        return list(cur.fetchall()) if cur.description else []


@dataclass
class PgNode(LocalNode):
    role: str
    port: int

    @property
    def title(self) -> str:
        return f"the {self.role}"


class PgFailoverPair:
    """Primary + standby, and the controls the cluster checks use (kill the primary, promote the standby)."""

    kind = "failover"

    def __init__(self, root: Path, user: str | None, bin_dir: Path, synchronous: bool = True) -> None:
        self.root, self.user, self.bin, self.synchronous = root, user, bin_dir, synchronous
        p1, p2 = free_ports(2)
        self.primary = PgNode("primary", p1, datadir=root / "primary")
        self.standby = PgNode("standby", p2, datadir=root / "standby")
        self.started_in = 0.0
        self.promoted_in: float | None = None

    def _start(self, node: PgNode) -> None:
        args = [str(self.bin / "postgres"), "-D", str(node.datadir), "-c", f"port={node.port}",
                "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}",
                "-c", "shared_buffers=32MB", "-c", "max_connections=120", "-c", "wal_level=replica",
                "-c", "max_wal_senders=4", "-c", "hot_standby=on", "-c", f"cluster_name={node.role}",
                "-c", "wal_receiver_status_interval=1s", "-c", "fsync=off"]  # a crash here is a process kill
        node.proc = spawn(args, node.log, self.user)
        _wait_until(lambda: bool(_query(node.port, "SELECT 1")), 60, f"PostgreSQL {node.role} did not start",
                    node.alive)

    def start(self) -> None:
        started = time.monotonic()
        chown_tree(self.root, self.user)
        run_as([str(self.bin / "initdb"), "-D", str(self.primary.datadir), "-U", "postgres", "--auth=trust",
                "--no-sync", "-E", "UTF8", "--locale=C"], self.user, "initdb of the primary")
        self._start(self.primary)
        run_as([str(self.bin / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
                "-D", str(self.standby.datadir), "-c", "fast", "-X", "stream", "-R", "--no-sync"],
               self.user, "pg_basebackup of the standby")
        self._start(self.standby)
        self._wait_replication("streaming", "the standby did not start streaming")
        if self.synchronous:
            _query(self.primary.port, "ALTER SYSTEM SET synchronous_standby_names = '*'")
            _query(self.primary.port, "ALTER SYSTEM SET synchronous_commit = 'on'")
            _query(self.primary.port, "SELECT pg_reload_conf()")
            self._wait_replication("sync", "the standby did not become synchronous")
        self.started_in = time.monotonic() - started

    def _wait_replication(self, wanted: str, what: str) -> None:
        column = "sync_state" if wanted == "sync" else "state"

        def ready() -> bool:
            return [r[0] for r in _query(self.primary.port, f"SELECT {column} FROM pg_stat_replication")] == [wanted]

        _wait_until(ready, 60, what, lambda: self.primary.alive() or self.standby.alive())

    def url(self) -> URL:
        hosts = (f"127.0.0.1:{self.primary.port}", f"127.0.0.1:{self.standby.port}")
        return URL.create("postgresql+psycopg", "postgres", None, None, None, "postgres",
                          query={"host": hosts, "target_session_attrs": "read-write"})

    def stop(self) -> None:
        import signal

        for node in (self.primary, self.standby):
            if node.proc is not None:
                stop_group(node.proc, sig=signal.SIGINT)  # SIGINT: fast shutdown (SIGTERM waits for clients)
        shutil.rmtree(self.root, ignore_errors=True)

    # --- ClusterControls -----------------------------------------------------------------------------------

    def node_urls(self) -> list[URL]:
        return [URL.create("postgresql+psycopg", "postgres", None, "127.0.0.1", n.port, "postgres")
                for n in (self.primary, self.standby) if not n.killed]

    def kill(self) -> str:
        """SIGKILL the primary's whole process group (postmaster and backends): a crash, not a shutdown."""
        self.primary.kill()
        return f"primary (port {self.primary.port}) killed with SIGKILL"

    def promote(self) -> None:
        started = time.monotonic()
        _query(self.standby.port, "SELECT pg_promote(wait => true, wait_seconds => 60)")
        _wait_until(lambda: _query(self.standby.port, "SELECT pg_is_in_recovery()") == [(False,)], 60,
                    "the promoted standby did not leave recovery", self.standby.alive)
        self.promoted_in = time.monotonic() - started

    def facts(self) -> dict[str, object]:
        facts: dict[str, object] = {
            "replication": "synchronous (synchronous_commit = on)" if self.synchronous else "asynchronous",
            "cold start (s)": round(self.started_in, 1)}
        if self.promoted_in is not None:
            facts["promotion (s)"] = round(self.promoted_in, 1)
        return facts


def postgresql_ha(entry: CatalogueEntry, synchronous: bool = True) -> Server:
    bin_dir = bindir()
    pair = start_cluster(lambda root, user: PgFailoverPair(root, user, bin_dir, synchronous), prefix="idem-pgha-",
                         user="postgres", driver=("psycopg", "psycopg", "postgresql"))
    mode = "synchronous" if synchronous else "asynchronous"
    how = (f"PostgreSQL primary 127.0.0.1:{pair.primary.port} + {mode} streaming standby 127.0.0.1:"
           f"{pair.standby.port} ({bin_dir}), multi-host URL with target_session_attrs=read-write; started in"
           f" {pair.started_in:.1f} s")
    return Server(entry.name, pair.url(), how, pair.stop, controls=pair)
