"""`galera-haproxy-all-writers` and `galera-haproxy-single-writer`: HAProxy (Debian's `haproxy`) in front of a
3-node Galera cluster (engines/galera.py), in the two layouts deployments use.

- **all writers**: ``balance roundrobin`` over the three nodes, so one connection pool spreads its sessions over
  every node (each takes writes; certification decides between them at commit).
- **single writer**: node 1 takes every session, nodes 2 and 3 are ``backup`` servers that take over only when it is
  down; a one-entry stick table keeps the sessions on whichever node took over, so two nodes never take writes at
  once (a recovered node 1 does not take them back). Its URL says ``writers=single``, which the MariaDB backend
  reads: an atomic claim is exclusive again there.

The health check is real: HAProxy runs an external check (`CHECK_SCRIPT`, the ``mariadb`` client) every second
that passes only on a node whose ``wsrep_local_state`` is 4 (Synced) and ``wsrep_ready`` ON, so a node that is
joining, donating or outside the primary component gets no sessions; a node marked down has its sessions shut
(``on-marked-down shutdown-sessions``) so clients reconnect to a healthy one. The check tolerates a slow machine
(a node is marked down after 3 failed checks, each allowed 10 s; a dead node fails each at once), and a connection
HAProxy cannot make is redispatched to another server (``option redispatch``). The failover control kills a node
(all writers: node 3; single writer: the node taking the sessions), waits for HAProxy to mark it down, and
rejoins it afterwards (IST).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import URL

from .entry import CatalogueEntry, Server, Unavailable
from .galera import GaleraCluster, Node, provider, url
from .local import first_gone, free_ports, spawn, start_cluster, stop_group, wait_until

HAPROXY = Path("/usr/sbin/haproxy")
# What every session of the engines' URL runs: the setting docs/clusters.md gives users whose sessions spread over
# the nodes (reads see what another node acknowledged).
SESSION_SETTINGS = "SET SESSION wsrep_sync_wait=7"
CHECK_SCRIPT = """#!/bin/sh
# HAProxy external check ($3: the server's address, $4: its port): a Galera node that is Synced and ready.
status=$(mariadb --no-defaults --protocol=tcp -h "$3" -P "$4" -u root --connect-timeout=5 -N -B \\
  -e "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_state', 'wsrep_ready')") || exit 1
case "$status" in *"wsrep_local_state	4"*) ;; *) exit 1 ;; esac
case "$status" in *"wsrep_ready	ON"*) exit 0 ;; esac
exit 1
"""


def _require() -> Path:
    missing = [f"{path} ({package})" for path, package in ((HAPROXY, "haproxy"),) if not path.exists()]
    if shutil.which("mariadb") is None:
        missing.append("mariadb (mariadb-client, the health check's client)")
    if missing:
        raise Unavailable(f"missing {', '.join(missing)}")
    return provider()


@dataclass
class HAProxyGalera:
    """A Galera cluster, HAProxy in front of it in one layout, and the controls the cluster checks use."""

    galera: GaleraCluster
    layout: str
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    kind: str = "multi-primary"
    started_in: float = 0.0
    failed_over_in: float | None = None
    rejoined_in: float | None = None
    first_failure: str | None = None

    @property
    def root(self) -> Path:
        return self.galera.root

    @property
    def name(self) -> str:
        return f"galera-{self.layout}"

    def start(self) -> None:
        started = time.monotonic()
        self.galera.start()
        self.port = free_ports(1)[0]
        check = self.root / "galera-check.sh"
        check.write_text(CHECK_SCRIPT)
        check.chmod(0o755)
        (self.root / "haproxy.cfg").write_text(self._config(check))
        self.proc = spawn([str(HAPROXY), "-db", "-f", str(self.root / "haproxy.cfg")], self.root / "haproxy.log",
                          ports=(self.port,))
        wait_until(lambda: [s["status"] for s in self.servers().values()] == ["UP"] * len(self.galera.nodes), 60,
                   "HAProxy did not mark the Galera nodes up", self._alive)
        self.started_in = time.monotonic() - started

    def _alive(self) -> str | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"haproxy exited with {self.proc.returncode}: {(self.root / 'haproxy.log').read_text()[-500:]}"

    def gone(self) -> str | None:
        return self._alive() or first_gone(self.galera.nodes)

    def _config(self, check: Path) -> str:
        servers = []
        for node in self.galera.nodes:
            backup = " backup" if self.layout == "single" and node.index > 1 else ""
            servers.append(f"  server node{node.index} 127.0.0.1:{node.port}{backup}")
        # Single writer: one stick-table entry (keyed on the frontend's address) holds the node taking writes.
        stick = "  stick-table type ip size 1\n  stick on dst\n" if self.layout == "single" else ""
        return f"""global
  external-check
  insecure-fork-wanted
  stats socket {self.root / "haproxy.sock"} mode 600 level admin
  maxconn 2000

defaults
  mode tcp
  timeout connect 5s
  timeout client 1h
  timeout server 1h
  timeout check 10s
  retries 3
  option redispatch

listen {self.name}
  bind 127.0.0.1:{self.port}
  balance roundrobin
{stick}  option external-check
  external-check path "/usr/bin:/bin"
  external-check command {check}
  default-server check inter 1s fall 3 rise 2 on-marked-down shutdown-sessions
""" + "\n".join(servers) + "\n"

    def _admin(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.root / "haproxy.sock"))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def servers(self) -> dict[str, dict[str, str]]:
        """HAProxy's view of each server (``show stat``): status (UP/DOWN), current and total sessions."""
        lines = self._admin("show stat").strip().splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:]]
        return {r["svname"]: r for r in rows if r["pxname"] == self.name and r["svname"] not in ("FRONTEND", "BACKEND")}

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, grace=5)
        self.galera.stop()

    def url(self, failover_window: float | None = None) -> URL:
        # The URL docs/clusters.md tells users to run: every session waits for the other nodes' commits (DDL
        # included: a table created through one node must exist on the next; the suite's own counts read whichever
        # node HAProxy picks), not only the backend's claim connections; the node URLs keep the server default, so
        # the cross-node replay check proves the backend's own setting.
        window = {} if failover_window is None else {"failover_window": f"{failover_window:g}"}
        return url(self.port).update_query_dict({"init_command": SESSION_SETTINGS, "writers": self.layout, **window})

    # --- ClusterControls -----------------------------------------------------------------------------------

    def node_urls(self) -> list[URL]:
        return self.galera.node_urls()

    def _victim(self) -> Node:
        live = [n for n in self.galera.nodes if not n.killed]
        if self.layout == "single":  # the writer: the server holding the sessions
            servers = self.servers()
            return max(live, key=lambda n: int(servers[f"node{n.index}"].get("scur") or 0))
        return live[-1]

    def kill(self) -> str:
        """SIGKILL one node with its SST helpers (single writer: the one taking writes): a crash, not a shutdown."""
        self.galera.wait_primary(60)
        victim = self._victim()
        victim.kill()
        self._killed, self._killed_at = victim, time.monotonic()
        return f"node {victim.index} (port {victim.port}) killed with SIGKILL"

    def await_failover(self) -> None:
        """Until HAProxy has marked the killed node down (its sessions shut; single writer: a backup takes over) and
        the survivors form a primary component (without one no node takes writes, however long callers retry)."""
        name = f"node{self._killed.index}"
        wait_until(lambda: self.servers()[name]["status"].startswith("DOWN"), 30,
                   "HAProxy did not mark the killed node down", self._alive)
        self.failed_over_in = time.monotonic() - self._killed_at
        self.galera.wait_primary(90)

    def rejoin(self) -> str:
        started = time.monotonic()
        self.galera.restart(self._killed)
        name = f"node{self._killed.index}"
        wait_until(lambda: self.servers()[name]["status"] == "UP", 30, "HAProxy did not mark the node up again",
                   self._alive)
        self.rejoined_in = time.monotonic() - started
        return f"node {self._killed.index} rejoined (Synced, marked up by HAProxy) in {self.rejoined_in:.1f} s"

    def facts(self) -> dict[str, Any]:
        servers = self.servers()
        facts: dict[str, Any] = {
            "layout": "all writers (roundrobin)" if self.layout == "all" else "single writer (backup servers)",
            "nodes": f"{sum(not n.killed for n in self.galera.nodes)} of {len(self.galera.nodes)} live",
            "HAProxy sessions per node": [int(servers[f"node{n.index}"].get("stot") or 0) for n in self.galera.nodes],
            "certification failures (all nodes)": self.galera.certification_failures(),
            "cold start (s)": round(self.started_in, 1)}
        if self.failed_over_in is not None:
            facts["kill to HAProxy marking it down (s)"] = round(self.failed_over_in, 1)
        if self.rejoined_in is not None:
            facts["killed node rejoined (s)"] = round(self.rejoined_in, 1)
        return facts


def galera_haproxy(layout: str) -> HAProxyGalera:
    """Start the stack; a start that fails (a Galera state transfer can abort on a loaded host) is tried once more
    on fresh data dirs, and the first failure is kept in `first_failure`."""
    galera_provider = _require()

    def start() -> HAProxyGalera:
        return start_cluster(lambda root, user: HAProxyGalera(GaleraCluster(root, user, galera_provider), layout),
                             prefix=f"idem-galera-{layout}-", user="mysql", driver=("pymysql", "PyMySQL", "mysql"))

    try:
        return start()
    except Unavailable as exc:
        stack = start()
        stack.first_failure = str(exc)
        return stack


def provide(entry: CatalogueEntry, layout: str) -> Server:
    stack = galera_haproxy(layout)
    ports = ", ".join(str(n.port) for n in stack.galera.nodes)
    what = "round robin over every node" if layout == "all" else "node 1, nodes 2 and 3 as backups"
    retried = f" (second attempt; the first failed: {stack.first_failure})" if stack.first_failure else ""
    how = (f"HAProxy ({HAPROXY}, {what}, external wsrep health check) on 127.0.0.1:{stack.port} in front of a 3-node"
           f" Galera cluster (galera-4, rsync SST) on ports {ports}; started in {stack.started_in:.1f} s{retried}")
    return Server(entry.name, stack.url(entry.failover_window), how, stack.stop, controls=stack, gone=stack.gone)
