"""The local PostgreSQL server binaries, and one server of them in a temp dir (what PgBouncer fronts).

As root every PostgreSQL process runs as the `postgres` system user (PostgreSQL refuses root) in a temp dir it
owns; `IDEM_PG_BINDIR` names another bin directory. The machine's own PostgreSQL service is never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from .entry import Unavailable
from .local import LocalNode, chown_tree, run_as, spawn, stop_group, wait_until

BIN_DIRS = (os.environ.get("IDEM_PG_BINDIR", ""), "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin",
            "/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/18/bin")


def bindir() -> Path:
    for candidate in BIN_DIRS:
        if candidate and all((Path(candidate) / tool).exists() for tool in ("initdb", "postgres", "pg_rewind")):
            return Path(candidate)
    raise Unavailable("no PostgreSQL server binaries (initdb, postgres, pg_rewind) in "
                      + ", ".join(d for d in BIN_DIRS if d))


def postmaster_pid(datadir: Path) -> int | None:
    """The pid in the data dir's postmaster.pid if that process is still this data dir's postmaster (a killed
    postmaster leaves its file behind, and the kernel may give its pid to any other process since)."""
    try:
        pid = int((datadir / "postmaster.pid").read_text().split("\n", 1)[0])
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if str(datadir).encode() in args else None


def stop_postmaster(datadir: Path, grace: float = 20.0) -> None:
    """Stop the postmaster running on `datadir`, if one does (fast shutdown; SIGKILL if it outlives `grace`): for a
    server whose start was interrupted before its handle was known."""
    pid = postmaster_pid(datadir)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + grace
        while postmaster_pid(datadir) == pid and time.monotonic() < deadline:
            time.sleep(0.1)
        if postmaster_pid(datadir) == pid:
            os.kill(pid, signal.SIGKILL)


def query(port: int, sql: str, timeout: int = 2) -> list[tuple[object, ...]]:
    """One statement as the superuser on 127.0.0.1:`port` (autocommit), its rows."""
    import psycopg  # the [postgresql] extra; start_cluster checks it before any server starts

    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=timeout,
                         autocommit=True) as conn:
        cur = conn.execute(sql)  # type: ignore[call-overload, unused-ignore]  # psycopg wants a LiteralString
        return list(cur.fetchall()) if cur.description else []


@dataclass
class PgServer(LocalNode):
    """One PostgreSQL server: initdb, then postgres on 127.0.0.1:`port` with its socket in the data dir's parent."""

    port: int
    bin: Path
    user: str | None
    args: list[str] = field(default_factory=list, kw_only=True)  # postgres's command line, once started

    @property
    def title(self) -> str:
        return f"PostgreSQL on port {self.port}"

    def start(self, *settings: str) -> None:
        """initdb (trust, UTF8, C locale) and start; `settings` are extra ``name=value`` server settings."""
        chown_tree(self.datadir.parent, self.user)
        run_as([str(self.bin / "initdb"), "-D", str(self.datadir), "-U", "postgres", "--auth=trust", "--no-sync",
                "-E", "UTF8", "--locale=C"], self.user, "initdb")
        args = [str(self.bin / "postgres"), "-D", str(self.datadir), "-c", f"port={self.port}",
                "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.datadir.parent}",
                "-c", "shared_buffers=32MB", "-c", "fsync=off"]  # a crash here is a process kill, not power loss
        for setting in settings:
            args += ["-c", setting]
        self.args = args
        self.run()

    def run(self) -> None:
        """Start the server on its data dir (again, after a `kill`: crash recovery) and wait until it answers."""
        self.proc = spawn(self.args, self.log, self.user, ports=(self.port,))
        self.killed = False
        wait_until(lambda: bool(query(self.port, "SELECT 1")), 60, "PostgreSQL did not start", self.alive)

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, sig=signal.SIGINT)  # SIGINT: fast shutdown (SIGTERM waits for clients)
