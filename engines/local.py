"""Helpers for servers the catalogue runs itself from local binaries: free loopback ports, child processes in
their own process group (so stopping one leaves nothing behind), the node and start-up steps the clusters share,
and the loopback TCP proxy base the conformance fault proxy builds on."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Protocol, Self, TypeVar

from .entry import Unavailable
from .started import track


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports nobody listens on now (held together while chosen, so they differ)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def unprivileged_user(name: str) -> str | None:
    """The system user to run a server as when we are root (servers refuse root or drop privileges); None when
    we are not root (the server runs as us)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise Unavailable(f"running as root and there is no {name!r} system user to run the server as") from None
    return name


def chown_tree(path: Path, user: str | None) -> None:
    if user is None:
        return
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    for root, dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


def ports_free(ports: Sequence[int], host: str = "127.0.0.1") -> None:
    """Unavailable, naming the port, if another process listens on one of `ports`: a server started there would fail
    to bind while a readiness probe reached the other process and took it for ours."""
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: a TIME_WAIT is no owner
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise Unavailable(f"port {port} on {host} is already in use by another process"
                                  f" ({exc.strerror or exc}); nothing was started on it") from None


def spawn(args: Sequence[str], log: Path, user: str | None = None, cwd: Path | None = None,
          ports: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start a server process as the leader of a new process group (its helpers - backends, SST scripts, rsync
    daemons - join that group), output to `log`; first make sure nobody else listens on its `ports`."""
    ports_free(ports)
    with open(log, "ab") as out:
        return subprocess.Popen(list(args), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, user=user, cwd=cwd)


def run_as(args: Sequence[str], user: str | None, what: str, timeout: float = 120) -> str:
    """Run a setup command (initdb, mariadb-install-db, pg_basebackup); Unavailable with its output on failure."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, user=user,
                              stdin=subprocess.DEVNULL, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{what} failed: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise Unavailable(f"{what} failed (exit {done.returncode}): {' | '.join(tail)}")
    return done.stdout


def group_members(proc: subprocess.Popen[bytes]) -> list[int]:
    """What is left of the group `proc` leads: `[proc.pid]` while the leader is not reaped (running or a zombie, it
    holds the number: the group is signalled whole by it); once it is, the helpers still in the group, if any.

    Once the leader is reaped the kernel may hand its number to any new process as soon as no process is left in the
    group, and pids wrap within minutes here (pid_max 32,768, a backend forked per connection): a leader of that
    number is then a stranger's, and its group is not ours to signal. While a helper of ours is left, the number stays
    taken (a process group's id is never reused while the group has a member), so the members found are ours."""
    if proc.returncode is None:  # not reaped: the leader, running or a zombie, holds the number
        return [proc.pid]
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == proc.pid:  # the field two after the state is the process group
            if int(entry.name) == proc.pid:
                return []  # a new leader of the number: a stranger's group
            members.append(int(entry.name))
    return members


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal a process group we started (the server and every helper it spawned): never a group that took over its
    number once it was gone (`group_members`)."""
    members = group_members(proc)
    if members == [proc.pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        return
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _asked_to_end(proc: subprocess.Popen[bytes], sig: int, grace: float) -> bool:
    """Send `sig` to a process we started, unless it has ended; whether it ends within `grace`."""
    if proc.poll() is not None:
        return True
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        return False
    return True


def stop_process(proc: subprocess.Popen[bytes], grace: float = 30.0, sig: int = signal.SIGTERM) -> bool:
    """Ask a process we started (a worker, a relay, an app server; not its group) to end with `sig`, SIGKILL it if
    it outlives `grace`; whether it ended on its own."""
    if _asked_to_end(proc, sig, grace):
        return True
    proc.kill()
    proc.wait()
    return False


def stop_group(proc: subprocess.Popen[bytes], grace: float = 20.0, sig: int = signal.SIGTERM) -> None:
    """Signal the server to shut down cleanly (`sig`: SIGTERM for mariadbd, SIGINT - fast shutdown - for
    postgres), SIGKILL its group if it outlives `grace`; leave no process behind."""
    _asked_to_end(proc, sig, grace)
    kill_group(proc)  # helpers left behind (an orphaned backend, an rsync daemon) go with the group
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def wait_until(ready: Callable[[], bool], timeout: float, what: str, alive: Callable[[], str | None]) -> None:
    """Poll `ready()` until true; Unavailable when `alive()` reports the process died (its reason) or on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except Exception:  # not accepting connections yet
            pass
        dead = alive()
        if dead is not None:
            raise Unavailable(f"{what}: {dead}")
        if time.monotonic() > deadline:
            raise Unavailable(f"{what}: not ready after {timeout:.0f} s")
        time.sleep(0.2)


class Cluster(Protocol):
    """What `start_cluster` needs of a stack (Patroni, PgBouncer, Galera behind HAProxy)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...  # stops every process and removes the cluster's temp dir


C = TypeVar("C", bound=Cluster)


def start_cluster(make: Callable[[Path, str | None], C], *, prefix: str, user: str, driver: tuple[str, str, str]) -> C:
    """Make (`make(temp dir, user to run as or None)`) and start a cluster of local servers in a new temp dir, as
    `user` when we are root; stop it (which removes the dir) when starting fails or is interrupted. `driver`, the
    client the cluster's checks use - (module, package, extra) - is checked first: no server starts without it."""
    module, package, extra = driver
    if find_spec(module) is None:
        raise Unavailable(f"{package} is not installed (pip install 'idem-dialects[{extra}]')")
    as_user = unprivileged_user(user)
    root = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = make(root, as_user)
    cluster.stop = track(f"{prefix.strip('-')} in {root}", cluster.stop)  # type: ignore[method-assign]
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def log_tail(path: Path, lines: int = 4) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    wanted = [line for line in text if "ERROR" in line or "FATAL" in line] or text
    return " | ".join(line.strip()[-200:] for line in wanted[-lines:])


@dataclass
class LocalNode:
    """One server process of a cluster we run: its data dir (its log beside it, named after it), its process once
    spawned, and whether a cluster check killed it. Subclasses add their ports and say how errors name the node."""

    datadir: Path = field(kw_only=True)
    proc: subprocess.Popen[bytes] | None = field(default=None, kw_only=True)
    killed: bool = field(default=False, kw_only=True)

    @property
    def title(self) -> str:
        raise NotImplementedError

    @property
    def log(self) -> Path:
        return self.datadir.parent / f"{self.datadir.name}.log"

    def alive(self) -> str | None:
        """None while the process runs (or before it is spawned); else why it is gone, for `wait_until`."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"{self.title} exited with {self.proc.returncode}: {log_tail(self.log)}"

    def kill(self) -> None:
        """SIGKILL the node's whole process group (the server and its helpers): a crash, not a shutdown."""
        assert self.proc is not None
        kill_group(self.proc)
        self.proc.wait(10)
        self.killed = True


def mariadb_dirs(datadir: Path, tmpdir: Path) -> list[str]:
    """The options that keep a private mariadbd (or mariadb-install-db) to its own files. Its own tmpdir, not /tmp: a
    starting mariadbd deletes every `#sql*` file in its tmpdir as left over from its last run, and in /tmp those are
    the machine's own MariaDB's temporary tables (which then fails statements with "Error on delete of
    '/tmp/#sql-temptable-...'")."""
    return ["--no-defaults", f"--datadir={datadir}", f"--tmpdir={tmpdir}"]


def first_gone(nodes: Iterable[LocalNode]) -> str | None:
    """Why the first node not killed on purpose is no longer running, or None while they all run."""
    return next((why for node in nodes if not node.killed and (why := node.alive())), None)


def connect_to(address: tuple[str, int] | str) -> socket.socket:
    """A connection to a server's (host, port), or to its Unix socket path (`Provision.server_address`)."""
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            raise
        return sock
    return socket.create_connection(address)


def close_socket(sock: socket.socket) -> None:
    """Shut down both directions before closing, so the peer (and a thread blocked in recv) sees the disconnect."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class LoopbackProxy:
    """A listener on a free 127.0.0.1 port that pairs each client connection with a new upstream connection.

    Subclasses say how to reach the upstream (`_connect`, OSError when it cannot: the client is dropped) and how to
    carry the pair's bytes (`_serve`, which must not block); both sockets stay in `_open` until `_forget`, so
    `close` cuts the live links too. Subclasses set their own state before calling this `__init__`: it starts
    accepting at once."""

    def __init__(self, name: str) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, name=name, daemon=True).start()

    def _connect(self) -> socket.socket:
        raise NotImplementedError

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = self._connect()
            except OSError:
                close_socket(client)
                continue
            for sock in (client, upstream):
                if sock.family != socket.AF_UNIX:  # as drivers do: no small write waits for the previous one's ACK
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open.update((client, upstream))
            self._serve(client, upstream)

    def _forget(self, *socks: socket.socket) -> None:
        """Close a finished link's sockets (both: one side gone, the other must see the disconnect)."""
        for sock in socks:
            close_socket(sock)
        with self._lock:
            self._open.difference_update(socks)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        self._listener.close()
        with self._lock:
            pending = list(self._open)
        for sock in pending:
            close_socket(sock)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
