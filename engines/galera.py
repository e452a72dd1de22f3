"""A 3-node MariaDB Galera cluster on loopback ports, from Debian's mariadbd + galera-4 + rsync (the cluster behind
the `galera-haproxy-*` engines, engines/haproxy.py).

Node 1 is initialised with mariadb-install-db and bootstraps the cluster (--wsrep-new-cluster); nodes 2 and 3
start on empty data dirs, one after the other, and receive node 1's state by rsync SST. Every node runs with
--no-defaults (the machine's own MariaDB configuration never applies) as the `mysql` user when we are root: mariadbd
drops to it before the SST script starts its rsync daemon, so the daemon writes the joiner's data dir as its owner
(an rsync daemon started by root would drop to `nobody`). A killed node restarts on its data dir and rejoins by IST.
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import URL

from .entry import Unavailable
from .local import LocalNode, chown_tree, free_ports, kill_group, mariadb_dirs, run_as, spawn, stop_group
from .local import wait_until as _wait_until

MARIADBD = Path("/usr/sbin/mariadbd")
INSTALL_DB = ("mariadb-install-db", "mysql_install_db")
PROVIDERS = (Path("/usr/lib/galera/libgalera_smm.so"), Path("/usr/lib/libgalera_smm.so"),
             Path("/usr/lib64/galera-4/libgalera_smm.so"))
NODES = 3
# A killed node is suspected after 3 s (Galera's default is 5), so failover stays quick; the view change that
# follows gets twice Galera's default room (inactive 15 s, install 7.5 s). With inactive at 6 s, the survivors on a
# saturated 2-core host once ran out of install time during the view change and fell to a non-primary component
# that never recovered (under the full CI load).
EVS_TIMEOUTS = ("evs.suspect_timeout=PT3S;evs.inactive_timeout=PT30S;evs.install_timeout=PT15S;"
                "pc.wait_prim_timeout=PT30S")


def provider() -> Path:
    missing = []
    if not MARIADBD.exists():
        missing.append(f"{MARIADBD} (mariadb-server)")
    provider = next((p for p in PROVIDERS if p.exists()), None)
    if provider is None:
        missing.append("libgalera_smm.so (galera-4)")
    for tool in ("rsync", "wsrep_sst_rsync"):
        if shutil.which(tool) is None:
            missing.append(f"{tool} ({'rsync' if tool == 'rsync' else 'mariadb-server'})")
    if not any(shutil.which(t) for t in INSTALL_DB):
        missing.append("mariadb-install-db (mariadb-server)")
    if missing:
        raise Unavailable(f"missing {', '.join(missing)}")
    assert provider is not None
    return provider


def _client(port: int) -> object:
    import pymysql  # the [mysql] extra; checked before any node starts

    return pymysql.connect(host="127.0.0.1", port=port, user="root", password="", connect_timeout=2,
                           autocommit=True)


def _status(port: int) -> dict[str, str]:
    conn = _client(port)
    try:
        with conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_local_state_comment',"
                        " 'wsrep_cluster_status', 'wsrep_cluster_size', 'wsrep_local_cert_failures',"
                        " 'wsrep_local_bf_aborts')")
            return {str(k): str(v) for k, v in cur.fetchall()}
    finally:
        conn.close()  # type: ignore[attr-defined]


def _synced(status: dict[str, str]) -> bool:
    return status.get("wsrep_ready") == "ON" and status.get("wsrep_local_state_comment") == "Synced"


@dataclass
class Node(LocalNode):
    index: int
    port: int
    gcomm: int
    ist: int
    sst: int

    @property
    def title(self) -> str:
        return f"node {self.index}"

    @property
    def tmpdir(self) -> Path:
        return self.datadir.with_name(f"{self.datadir.name}-tmp")  # its own (local.mariadb_dirs)


@dataclass
class GaleraCluster:
    """Three nodes: start them, kill one, restart it."""

    root: Path
    user: str | None
    provider: Path
    nodes: list[Node] = field(default_factory=list)
    started_in: float = 0.0

    def args(self, node: Node, bootstrap: bool) -> list[str]:
        peers = ",".join(f"127.0.0.1:{n.gcomm}" for n in self.nodes)
        args = [
            str(MARIADBD), *mariadb_dirs(node.datadir, node.tmpdir), f"--port={node.port}",
            "--bind-address=127.0.0.1", f"--socket={node.datadir}/mysqld.sock",
            f"--pid-file={node.datadir}/pid", f"--log-error={node.log}", "--skip-name-resolve",
            "--performance-schema=OFF", "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M",
            "--max-connections=200", "--character-set-server=utf8mb4", "--binlog-format=ROW",
            "--default-storage-engine=InnoDB", "--innodb-autoinc-lock-mode=2", "--innodb-flush-log-at-trx-commit=2",
            "--wsrep-on=ON", f"--wsrep-provider={self.provider}", "--wsrep-cluster-name=idem-dialects",
            f"--wsrep-cluster-address=gcomm://{peers}", f"--wsrep-node-name=node{node.index}",
            f"--wsrep-node-address=127.0.0.1:{node.gcomm}", "--wsrep-sst-method=rsync",
            f"--wsrep-sst-receive-address=127.0.0.1:{node.sst}",
            f"--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{node.gcomm};"
            f"ist.recv_addr=127.0.0.1:{node.ist};gcache.size=64M;{EVS_TIMEOUTS}",
        ]
        if self.user is not None:
            args.append(f"--user={self.user}")
        if bootstrap:
            args.append("--wsrep-new-cluster")
        return args

    def start(self) -> None:
        started = time.monotonic()
        self.root.chmod(0o755)
        ports = free_ports(4 * NODES)
        for i in range(NODES):
            port, gcomm, ist, sst = ports[4 * i:4 * i + 4]
            node = Node(i + 1, port, gcomm, ist, sst, datadir=self.root / f"node{i + 1}")
            node.datadir.mkdir()
            node.tmpdir.mkdir()
            self.nodes.append(node)
        first = self.nodes[0]
        install = next(shutil.which(t) for t in INSTALL_DB if shutil.which(t))
        assert install is not None
        chown_tree(self.root, self.user)
        run_as([install, *mariadb_dirs(first.datadir, first.tmpdir), "--auth-root-authentication-method=normal",
                "--skip-test-db",
                *([f"--user={self.user}"] if self.user else [])], None,
               "mariadb-install-db for Galera node 1")
        chown_tree(self.root, self.user)
        first.proc = spawn(self.args(first, bootstrap=True), first.log, ports=(first.port, first.gcomm))
        self.wait_synced(first, 60)
        for node in self.nodes[1:]:  # one state transfer at a time: two at once from one donor can abort on a busy host
            self.join(node)
        self.started_in = time.monotonic() - started
        conn = _client(first.port)  # the database the URLs name
        try:
            with conn.cursor() as cur:  # type: ignore[attr-defined]
                cur.execute("CREATE DATABASE IF NOT EXISTS test")
        finally:
            conn.close()  # type: ignore[attr-defined]

    def wait_synced(self, node: Node, timeout: float) -> None:
        _wait_until(lambda: _synced(_status(node.port)), timeout, f"Galera node {node.index} did not become Synced",
                    node.alive)

    def wait_primary(self, timeout: float) -> None:
        """Until every live node is Synced in one primary component holding all of them: before a kill (it must hit a
        whole cluster, not one still settling a view change) and after it (no node takes writes until then)."""
        live = [n for n in self.nodes if not n.killed]

        def whole() -> bool:
            for node in live:
                status = _status(node.port)
                if not (_synced(status) and status.get("wsrep_cluster_status") == "Primary"
                        and status.get("wsrep_cluster_size") == str(len(live))):
                    return False
            return True

        _wait_until(whole, timeout, f"Galera nodes {[n.index for n in live]} did not form one primary component",
                    lambda: next(filter(None, (n.alive() for n in live)), None))

    def stop(self) -> None:
        threads = [threading.Thread(target=stop_group, args=(n.proc,)) for n in self.nodes if n.proc is not None]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        shutil.rmtree(self.root, ignore_errors=True)

    def node_urls(self) -> list[URL]:
        return [url(n.port) for n in self.nodes if not n.killed]

    def restart(self, node: Node) -> None:
        """Start a killed node again on its data dir: it rejoins the primary component (IST from a donor)."""
        node.killed = False
        self.join(node)

    def join(self, node: Node) -> None:
        """Start `node` as a joiner and wait until it is Synced. On a saturated host a state transfer can fail (the
        donor's transfer gives up, and the joiner aborts: "Will never receive state. Need to abort."); the node's next
        start asks for the state again, as an operator would restart it: one more start, then Unavailable."""
        for attempt in (1, 2):
            node.proc = spawn(self.args(node, bootstrap=False), node.log, ports=(node.port, node.gcomm))
            try:
                self.wait_synced(node, 120)
                return
            except Unavailable:
                if attempt == 2 or node.proc.poll() is None:  # still running: a timeout, which a restart won't fix
                    raise
                kill_group(node.proc)  # what the aborted node left (its rsync daemon) goes with its group

    def certification_failures(self) -> int | str:
        try:
            return sum(int(_status(n.port).get("wsrep_local_cert_failures", 0)) for n in self.nodes if not n.killed)
        except Exception as exc:  # a fact for a report; a node going away must not fail the check
            return f"unreadable: {exc}"


def url(port: int) -> URL:
    return URL.create("mariadb+pymysql", "root", None, "127.0.0.1", port, "test", query={"charset": "utf8mb4"})
