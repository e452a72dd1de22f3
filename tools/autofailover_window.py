"""Measure a pg_auto_failover failover's window as callers of `run` see it (docs: Clusters and failover).

Starts a monitor and two PostgreSQL 15 nodes with Debian's `postgresql-15-auto-failover` (`pg_autoctl create ...
--run`, its defaults, on loopback ports, as the postgres user, in a temp dir), runs `store.run` from 8 threads on the
libpq multi-host URL with `target_session_attrs=read-write` and a 120 s retry budget, SIGKILLs the primary's keeper
and postmaster, and reports the longest time without an acknowledgement from the kill on and the longest `run` call.
``.venv/bin/python tools/autofailover_window.py [RUNS]`` (as root: the servers run as postgres).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from failover_load import window_under_load  # tools/, beside this script

from idem_dialects import IdempotencyStore, RetryPolicy
from idem_dialects.engines.local import chown_tree, free_ports, kill_group, unprivileged_user, wait_until
from idem_dialects.engines.pgserver import bindir

PG_AUTOCTL = shutil.which("pg_autoctl") or "/usr/bin/pg_autoctl"


def autoctl(args: list[str], user: str | None, env: dict[str, str]) -> str:
    done = subprocess.run([PG_AUTOCTL, *args], capture_output=True, text=True, user=user, env=env, timeout=60,
                          cwd="/")
    return done.stdout


def measure() -> dict[str, float]:
    user = unprivileged_user("postgres")
    root = Path(tempfile.mkdtemp(prefix="idem-autofailover-"))
    root.chmod(0o755)
    chown_tree(root, user)
    env = {**os.environ, "PATH": f"{bindir()}:{os.environ['PATH']}", "HOME": str(root),
           "XDG_CONFIG_HOME": str(root / "config"), "XDG_DATA_HOME": str(root / "data")}
    monitor_port, *node_ports = free_ports(3)
    monitor = f"postgres://autoctl_node@127.0.0.1:{monitor_port}/pg_auto_failover?sslmode=disable"
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = root / f"{name}.log"
        cmd = [PG_AUTOCTL, *args, "--pgdata", str(root / name), "--hostname", "127.0.0.1", "--auth", "trust",
               "--no-ssl", "--run"]
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, user=user, env=env, cwd=str(root))
        procs.append(proc)
        return proc

    def states() -> list[dict[str, Any]]:
        out = autoctl(["show", "state", "--pgdata", str(root / "monitor"), "--json"], user, env)
        try:
            return list(json.loads(out))
        except ValueError:
            return []

    try:
        start("monitor", ["create", "monitor", "--pgport", str(monitor_port)])
        time.sleep(3)
        nodes = {}
        for i, port in enumerate(node_ports, 1):
            nodes[f"node{i}"] = start(f"node{i}", ["create", "postgres", "--pgport", str(port), "--monitor", monitor,
                                                    "--dbname", "postgres", "--username", "postgres",
                                                    "--name", f"node{i}"])
            wait_until(lambda i=i: len([s for s in states() if s.get("current_group_state") in
                                        ("single", "primary", "secondary")]) >= i, 180, f"node{i} did not join",
                       lambda: None)
        wait_until(lambda: {s.get("current_group_state") for s in states()} == {"primary", "secondary"}, 180,
                   "no primary and secondary", lambda: None)
        primary = next(s["nodename"] for s in states() if s.get("current_group_state") == "primary")
        hosts = "&".join(f"host=127.0.0.1:{p}" for p in node_ports)
        url = f"postgresql+psycopg://postgres@/postgres?{hosts}&target_session_attrs=read-write"
        store = IdempotencyStore.from_url(url, table_prefix="af_", retry=RetryPolicy(total=120), pool_size=8,
                                          max_overflow=0)
        store.create_tables()

        def recovered(killed_at: float, acked_at: list[float]) -> None:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not [t for t in acked_at if t > killed_at + 0.5]:
                time.sleep(0.5)

        # the keeper and the postgres it supervises: a crashed machine
        return window_under_load(store, lambda: kill_group(nodes[primary]), recovered)
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1):
        print("pg_auto_failover (defaults)", measure(), flush=True)


if __name__ == "__main__":
    main()
