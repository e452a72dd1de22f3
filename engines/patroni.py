"""`postgresql-patroni`: two PostgreSQL nodes managed by Patroni (Debian's `patroni`) with a 3-member etcd cluster
(Debian's `etcd-server`) as its DCS, all on loopback ports in one temp dir.

Patroni bootstraps the first node (initdb), clones the second from it (pg_basebackup) and keeps the leader lock in
etcd with a short ttl (`TTL`), so a dead leader is replaced within seconds. In synchronous mode the replica is the
synchronous standby (a commit is acknowledged once it has it), and only it may be promoted: no acknowledged key is
lost. Asynchronous clusters (``synchronous=False``) keep Patroni's lag guard, ``maximum_lag_on_failover``: a
replica further behind than that is never promoted. Clients use one libpq multi-host URL with
``target_session_attrs=read-write``, which reaches whichever node leads. The failover control kills the leader's
Patroni and postmaster with SIGKILL and waits for Patroni to elect the other node: nothing is promoted by hand. The
old leader rejoins by starting its Patroni again (pg_rewind if its timeline diverged). As root every process runs as
the `postgres` system user (PostgreSQL refuses root). Patroni starts each postmaster in a session of its own, so the
harness finds it by its data dir's postmaster.pid and signals it by pid.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import URL

from .entry import CatalogueEntry, Server, Unavailable
from .local import (
    LocalNode,
    chown_tree,
    first_gone,
    free_ports,
    kill_group,
    spawn,
    start_cluster,
    stop_group,
    wait_until,
)
from .pgserver import bindir, postmaster_pid, query

ETCD, PATRONI = Path("/usr/bin/etcd"), Path("/usr/bin/patroni")
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 3  # Patroni wants ttl >= loop_wait + 2 x retry_timeout
# Patroni's own defaults (what a deployment that sets nothing runs): the failover window the default retry budget of
# RetryPolicy must cover (docs: Clusters and failover, measured with tools/failover_window.py).
DEFAULT_TIMING = (30, 10, 10)
MAX_LAG = 1024 * 1024  # maximum_lag_on_failover (bytes): Patroni's default


def _require() -> Path:
    missing = [f"{path} ({package})" for path, package in ((ETCD, "etcd-server"), (PATRONI, "patroni"))
               if not path.exists()]
    if missing:
        raise Unavailable(f"missing {', '.join(missing)}")
    return bindir()


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
        return json.loads(response.read() or b"null")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state is the parent's pid
                found.append(int(entry.name))
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class EtcdMember(LocalNode):
    name: str
    client: int
    peer: int

    @property
    def title(self) -> str:
        return f"etcd member {self.name}"

    def healthy(self) -> bool:
        return bool(_get(self.client, "/health").get("health") == "true")


@dataclass
class PatroniNode(LocalNode):
    """One Patroni process and the PostgreSQL it manages (data dir `datadir`, Patroni's output in `log`)."""

    name: str
    port: int
    rest: int
    config: Path = field(kw_only=True)

    @property
    def title(self) -> str:
        return f"Patroni {self.name}"

    def running(self) -> bool:
        """Patroni answers and its PostgreSQL runs."""
        return bool(_get(self.rest, "/patroni").get("state") == "running")

    def kill_postgres(self) -> int | None:
        """SIGKILL the postmaster (its own session, started by Patroni) and every backend it forked."""
        pid = postmaster_pid(self.datadir)
        if pid is None:
            return None
        children = _children(pid)
        _kill(pid)
        for child in children:
            _kill(child)
        return pid


@dataclass
class PatroniCluster:
    root: Path
    user: str | None
    bin: Path
    synchronous: bool = True
    etcd: list[EtcdMember] = field(default_factory=list)
    nodes: list[PatroniNode] = field(default_factory=list)
    kind: str = "failover"
    timing: tuple[int, int, int] = (TTL, LOOP_WAIT, RETRY_TIMEOUT)  # ttl, loop_wait, retry_timeout (seconds)
    started_in: float = 0.0
    elected_in: float | None = None
    rejoined_in: float | None = None

    def __post_init__(self) -> None:
        ports = free_ports(10)
        self.etcd = [EtcdMember(f"e{i + 1}", ports[2 * i], ports[2 * i + 1], datadir=self.root / f"etcd{i + 1}")
                     for i in range(3)]
        self.nodes = [PatroniNode(f"node{i + 1}", ports[6 + 2 * i], ports[7 + 2 * i],
                                  datadir=self.root / f"node{i + 1}", config=self.root / f"node{i + 1}.yml")
                      for i in range(2)]
        self.scope = f"idem-{secrets.token_hex(3)}"

    # --- start and stop ------------------------------------------------------------------------------------

    def start(self) -> None:
        started = time.monotonic()
        self.root.chmod(0o755)
        chown_tree(self.root, self.user)
        peers = ",".join(f"{m.name}=http://127.0.0.1:{m.peer}" for m in self.etcd)
        for member in self.etcd:
            member.proc = spawn([
                str(ETCD), "--name", member.name, "--data-dir", str(member.datadir),
                "--listen-client-urls", f"http://127.0.0.1:{member.client}",
                "--advertise-client-urls", f"http://127.0.0.1:{member.client}",
                "--listen-peer-urls", f"http://127.0.0.1:{member.peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{member.peer}",
                "--initial-cluster", peers, "--initial-cluster-token", self.scope, "--initial-cluster-state", "new",
                "--heartbeat-interval", "100", "--election-timeout", "1000"], member.log, self.user, cwd=self.root,
                ports=(member.client, member.peer))
        for member in self.etcd:
            wait_until(member.healthy, 60, f"{member.title} did not become healthy", member.alive)
        for node in self.nodes:
            node.config.write_text(self._config(node))
        chown_tree(self.root, self.user)
        for node in self.nodes:  # node1 first: it takes the initialize key and runs initdb, node2 clones it
            node.proc = spawn([str(PATRONI), str(node.config)], node.log, self.user, cwd=self.root,
                              ports=(node.port, node.rest))
            wait_until(node.running, 120, f"{node.title} did not start PostgreSQL", node.alive)
        self.wait_healthy(120)
        self.started_in = time.monotonic() - started

    def _config(self, node: PatroniNode) -> str:
        # JSON is YAML: Patroni reads it as its configuration file.
        config = {
            "scope": self.scope, "name": node.name, "namespace": "/idem/",
            "restapi": {"listen": f"127.0.0.1:{node.rest}", "connect_address": f"127.0.0.1:{node.rest}"},
            "etcd3": {"hosts": [f"127.0.0.1:{m.client}" for m in self.etcd]},
            "bootstrap": {
                "dcs": {"ttl": self.timing[0], "loop_wait": self.timing[1], "retry_timeout": self.timing[2],
                        "maximum_lag_on_failover": MAX_LAG, "synchronous_mode": self.synchronous,
                        "postgresql": {"use_pg_rewind": True, "use_slots": True,
                                       "parameters": {"wal_log_hints": "on", "max_connections": 120,
                                                      "wal_keep_size": "128MB"}}},
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, {"auth": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.port}", "connect_address": f"127.0.0.1:{node.port}",
                "data_dir": str(node.datadir), "bin_dir": str(self.bin),
                "pgpass": str(self.root / f"{node.name}.pgpass"),
                "authentication": {"superuser": {"username": "postgres"}, "replication": {"username": "postgres"},
                                   "rewind": {"username": "postgres"}},
                "parameters": {"unix_socket_directories": str(self.root), "shared_buffers": "32MB",
                               "fsync": "off"},  # a crash here is a process kill, not power loss
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
            },
            "watchdog": {"mode": "off"},
        }
        return json.dumps(config, indent=1)

    def members(self) -> list[dict[str, Any]]:
        """The cluster as Patroni's REST API reports it, asked of any live node."""
        for node in self.nodes:
            if not node.killed:
                try:
                    return list(_get(node.rest, "/cluster").get("members", []))
                except OSError:
                    continue
        return []

    def leader(self) -> PatroniNode | None:
        """The node holding the leader key (a killed node's key lingers in etcd until its ttl runs out: not it)."""
        names = [m["name"] for m in self.members() if m.get("role") == "leader" and m.get("state") == "running"]
        return next((n for n in self.nodes if n.name in names and not n.killed), None)

    def elected(self, timeout: float) -> bool:
        """Whether Patroni elects a leader that takes writes within `timeout` seconds."""
        def writable() -> bool:
            leader = self.leader()
            return leader is not None and query(leader.port, "SELECT pg_is_in_recovery()") == [(False,)]

        try:
            wait_until(writable, timeout, "", lambda: None)
        except Unavailable:
            return False
        return True

    def wait_healthy(self, timeout: float) -> None:
        """Until a leader takes writes and the replica streams (synchronous mode: as the synchronous standby)."""
        wanted = "sync_standby" if self.synchronous else "replica"

        def healthy() -> bool:
            roles = sorted(m.get("role", "") for m in self.members() if m.get("state") in ("running", "streaming"))
            leader = self.leader()
            if roles != sorted(["leader", wanted]) or leader is None:
                return False
            streaming = query(leader.port, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
            return streaming == [(1,)]

        wait_until(healthy, timeout, "the Patroni cluster did not become healthy (a leader and a streaming replica)",
                   lambda: first_gone(self.nodes))

    def gone(self) -> str | None:
        return first_gone([*self.nodes, *self.etcd])

    def stop(self) -> None:
        def stop_node(node: PatroniNode) -> None:
            if node.proc is not None:
                stop_group(node.proc, grace=30)  # SIGTERM: Patroni stops its PostgreSQL (fast) and exits
            node.kill_postgres()  # a postmaster Patroni left behind (Patroni itself killed)

        threads = [threading.Thread(target=stop_node, args=(n,)) for n in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for member in self.etcd:
            if member.proc is not None:
                stop_group(member.proc, grace=10)
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, failover_window: float | None = None) -> URL:
        """The libpq multi-host URL that reaches the leader, declaring `failover_window` (seconds) if given."""
        hosts = tuple(f"127.0.0.1:{n.port}" for n in self.nodes)
        window = {} if failover_window is None else {"failover_window": f"{failover_window:g}"}
        return URL.create("postgresql+psycopg", "postgres", None, None, None, "postgres",
                          query={"host": hosts, "target_session_attrs": "read-write", **window})

    # --- ClusterControls -----------------------------------------------------------------------------------

    def node_urls(self) -> list[URL]:
        return [URL.create("postgresql+psycopg", "postgres", None, "127.0.0.1", n.port, "postgres")
                for n in self.nodes if not n.killed]

    def kill(self) -> str:
        """SIGKILL the leader's Patroni (so it neither demotes nor hands over) and its postmaster with every
        backend: a crashed machine, as far as the cluster can tell."""
        leader = self.leader()
        if leader is None:
            raise RuntimeError("no leader to kill")
        assert leader.proc is not None
        kill_group(leader.proc)
        leader.proc.wait(10)
        postmaster = leader.kill_postgres()
        leader.killed = True
        self._killed_at = time.monotonic()
        return (f"leader {leader.name} (port {leader.port}): Patroni pid {leader.proc.pid} and postmaster pid"
                f" {postmaster} killed with SIGKILL")

    def await_failover(self) -> None:
        """Wait for Patroni to elect the surviving node (once the dead leader's key expired, after the ttl) and for
        it to take writes. Nothing is promoted here."""
        if not self.elected(3 * self.timing[0] + 30):
            raise Unavailable("Patroni did not elect a new leader")
        self.elected_in = time.monotonic() - self._killed_at

    def rejoin(self) -> str:
        """Start the killed node's Patroni again: it rejoins as a replica of the new leader (pg_rewind if its
        timeline diverged), and in synchronous mode becomes the synchronous standby again."""
        node = next(n for n in self.nodes if n.killed)
        started = time.monotonic()
        node.proc = spawn([str(PATRONI), str(node.config)], node.log, self.user, cwd=self.root,
                          ports=(node.port, node.rest))
        node.killed = False
        self.wait_healthy(120)
        self.rejoined_in = time.monotonic() - started
        role = next(m.get("role") for m in self.members() if m["name"] == node.name)
        rewound = "running pg_rewind" in node.log.read_text(errors="replace")
        return (f"{node.name} rejoined as {role} in {self.rejoined_in:.1f} s"
                + (" after pg_rewind" if rewound else ""))

    def facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "members": ", ".join(f"{m['name']} {m.get('role')} {m.get('state')} timeline {m.get('timeline')}"
                                 for m in self.members()),
            "replication": "synchronous mode (synchronous_commit = on)" if self.synchronous else
                           f"asynchronous (maximum_lag_on_failover {MAX_LAG} bytes)",
            "ttl / loop_wait (s)": f"{self.timing[0]} / {self.timing[1]}", "cold start (s)": round(self.started_in, 1)}
        if self.elected_in is not None:
            facts["kill to new leader taking writes (s)"] = round(self.elected_in, 1)
        if self.rejoined_in is not None:
            facts["old leader rejoined (s)"] = round(self.rejoined_in, 1)
        return facts


def patroni_cluster(synchronous: bool = True,
                    timing: tuple[int, int, int] = (TTL, LOOP_WAIT, RETRY_TIMEOUT)) -> PatroniCluster:
    bin_dir = _require()
    return start_cluster(lambda root, user: PatroniCluster(root, user, bin_dir, synchronous, timing=timing),
                         prefix="idem-patroni-",
                         user="postgres", driver=("psycopg", "psycopg", "postgresql"))


def postgresql_patroni(entry: CatalogueEntry) -> Server:
    cluster = patroni_cluster()
    leader = cluster.leader()
    how = (f"Patroni ({PATRONI}, synchronous mode, ttl {TTL} s) over PostgreSQL ({cluster.bin}) on 127.0.0.1 ports"
           f" {', '.join(str(n.port) for n in cluster.nodes)} (leader {leader.name if leader else '?'}), 3 etcd"
           f" members; multi-host URL with target_session_attrs=read-write; started in {cluster.started_in:.1f} s")
    return Server(entry.name, cluster.url(entry.failover_window), how, cluster.stop, controls=cluster,
                  gone=cluster.gone)
