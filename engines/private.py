"""A private MariaDB server started from the local ``mariadbd`` binary in a temp dir on a free loopback port.

Only for checks that must stop and start a server (restart under load): the machine's own service is never
touched. Not a catalogue engine of its own (the shared suite runs on the machine's MariaDB); `private_server`
gives a `Server` with `restart` and `stop` for a backend (PostgreSQL: the embedded 18; MariaDB: this module).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import URL

from .containers import _need
from .servers import Server, Unavailable

_START_TIMEOUT = 60.0


def _binary(name: str, *fallbacks: str) -> str:
    found = shutil.which(name) or next((f for f in fallbacks if Path(f).exists()), None)
    if found is None:
        raise Unavailable(f"{name} is not installed here (apt-get install mariadb-server provides it)")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def private_mariadb(name: str = "mariadb-private") -> Server:
    """Initialise a data directory with mariadb-install-db and start mariadbd on it (as the current user)."""
    _need("pymysql", "mysql")
    import pymysql

    mariadbd = _binary("mariadbd", "/usr/sbin/mariadbd")
    install = _binary("mariadb-install-db", "/usr/bin/mariadb-install-db")
    directory = Path(tempfile.mkdtemp(prefix="idem-mariadb-"))
    data, port = directory / "data", _free_port()
    as_root = ["--user=root"] if os.geteuid() == 0 else []
    try:
        subprocess.run([install, "--no-defaults", f"--datadir={data}", "--skip-test-db",
                        "--auth-root-authentication-method=normal", *as_root],
                       check=True, capture_output=True, timeout=180)
    except (subprocess.SubprocessError, OSError) as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise Unavailable(f"mariadb-install-db failed: {exc}") from exc
    args = [mariadbd, "--no-defaults", f"--datadir={data}", f"--port={port}", "--bind-address=127.0.0.1",
            f"--socket={directory / 'mysqld.sock'}", f"--pid-file={directory / 'mysqld.pid'}",
            f"--log-error={directory / 'error.log'}", "--skip-grant-tables", "--skip-log-bin",
            "--innodb-buffer-pool-size=64M", "--performance-schema=OFF", *as_root]
    process: list[subprocess.Popen[bytes]] = []

    def ready() -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                pymysql.connect(host="127.0.0.1", port=port, user="root", connect_timeout=2).close()
                return
            except pymysql.err.OperationalError:
                if process[-1].poll() is not None or time.monotonic() > deadline:
                    log = (directory / "error.log").read_text(errors="replace")[-2000:]
                    raise Unavailable(f"private mariadbd did not start: {log}") from None
                time.sleep(0.1)

    def start() -> None:
        process.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        ready()

    def halt() -> None:
        if process and process[-1].poll() is None:
            process[-1].terminate()  # SIGTERM: a clean shutdown, connections dropped
            try:
                process[-1].wait(60)
            except subprocess.TimeoutExpired:
                process[-1].kill()
                process[-1].wait(10)

    def stop() -> None:
        halt()
        shutil.rmtree(directory, ignore_errors=True)

    def restart() -> None:
        halt()
        start()

    try:
        start()
        connection = pymysql.connect(host="127.0.0.1", port=port, user="root")
        with connection.cursor() as cursor:
            cursor.execute("CREATE DATABASE IF NOT EXISTS test CHARACTER SET utf8mb4")
        connection.close()
    except BaseException:
        stop()
        raise
    url = URL.create("mariadb+pymysql", "root", None, "127.0.0.1", port, "test", query={"charset": "utf8mb4"})
    return Server(name, url, f"private mariadbd ({mariadbd}) in {directory}, port {port}", stop, restart)


def _private_postgres(name: str) -> Server:
    from .catalogue import ENGINES
    from .servers import embedded_postgres

    return embedded_postgres(ENGINES["postgresql-18"])


# A server of a backend that this process starts (and so may restart), for checks whose engine under test is a
# server that is not ours: keyed by backend name.
PRIVATE_SERVERS: dict[str, Callable[[str], Server]] = {
    "postgresql": _private_postgres,
    "mariadb": private_mariadb,
}


def private_server(backend: str) -> Server:
    """Start a private server for `backend` (Unavailable if there is no way to here)."""
    start = PRIVATE_SERVERS.get(backend)
    if start is None:
        raise Unavailable(f"no way to start a private {backend} server here")
    return start(f"{backend}-private")
