"""MySQL's and MariaDB's test provisioning: their testcontainers recipe, a private MariaDB server for checks that
restart one, and what the fault proxy and the session checks need to know. Loaded only by the engine catalogue and
the conformance suite (`entry.PROVISIONS`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from idem_dialects.engines.containers import PASSWORD, host_port, started, testcontainers_module
from idem_dialects.engines.entry import Provision, Server, Unavailable, require_driver
from idem_dialects.engines.local import free_ports, mariadb_dirs, ports_free
from idem_dialects.engines.started import track

_START_TIMEOUT = 60.0


class MySQLProvision(Provision):
    create_database_sql = "CREATE DATABASE {name}"
    drop_database_sql = "DROP DATABASE IF EXISTS {name}"
    wire_protocol = "mysql"
    default_port = 3306
    session_id_sql = "SELECT CONNECTION_ID()"
    end_session_sql = "KILL CONNECTION {id}"

    @classmethod
    def container(cls, image: str, backend: str) -> tuple[Any, URL]:
        require_driver(backend, "pymysql")
        with testcontainers_module():
            from testcontainers.community.mysql import MySqlContainer
        mysql = MySqlContainer(image, dialect="pymysql", username="root", password=PASSWORD, dbname="test")
        running = started(mysql, image)
        host, port = host_port(running, 3306)
        return running, URL.create(f"{backend}+pymysql", "root", PASSWORD, host, port, "test",
                                   query={"charset": "utf8mb4"})

    @classmethod
    def plaintext_url(cls, url: URL, host: str, port: int) -> URL:
        # The MySQL drivers start TLS only when asked to (ssl_*); unix_socket would bypass host and port.
        query = {k: v for k, v in url.query.items() if k != "unix_socket" and not k.startswith("ssl")}
        return url.set(host=host, port=port, query=query)


class MariaDBProvision(MySQLProvision):
    @classmethod
    def private_server(cls, backend: str) -> Server:
        return private_mariadb(f"{backend}-private")


def _binary(name: str, *fallbacks: str) -> str:
    found = shutil.which(name) or next((f for f in fallbacks if Path(f).exists()), None)
    if found is None:
        raise Unavailable(f"{name} is not installed here (apt-get install mariadb-server provides it)")
    return found


def private_mariadb(name: str) -> Server:
    """A MariaDB server of our own (never the machine's service): mariadb-install-db makes a data directory in a
    temp dir, mariadbd runs on a free loopback port under mirakuru, which starts it, waits until the port accepts,
    and stops its whole process group (SIGTERM: a clean shutdown, connections dropped)."""
    require_driver("mariadb", "pymysql")
    try:
        from mirakuru import TCPExecutor
    except ImportError:
        raise Unavailable("mirakuru is not installed (pip install 'idem-dialects[engines]')") from None
    import pymysql

    mariadbd = _binary("mariadbd", "/usr/sbin/mariadbd")
    install = _binary("mariadb-install-db", "/usr/bin/mariadb-install-db")
    directory = Path(tempfile.mkdtemp(prefix="idem-mariadb-"))
    data, tmp, (port,) = directory / "data", directory / "tmp", free_ports(1)
    tmp.mkdir()  # its own (mariadb_dirs)
    server: Any = None

    def remove() -> None:
        if server is not None:
            server.stop()
        shutil.rmtree(directory, ignore_errors=True)

    stop = track(f"private mariadbd in {directory}", remove)
    as_root = ["--user=root"] if os.geteuid() == 0 else []
    try:
        subprocess.run([install, *mariadb_dirs(data, tmp), "--skip-test-db",
                        "--auth-root-authentication-method=normal", *as_root],
                       check=True, capture_output=True, timeout=180)
    except BaseException as exc:
        stop()
        if not isinstance(exc, subprocess.SubprocessError | OSError):
            raise
        raise Unavailable(f"mariadb-install-db failed: {exc}") from exc
    args = [mariadbd, *mariadb_dirs(data, tmp), f"--port={port}",
            "--bind-address=127.0.0.1", f"--socket={directory / 'mysqld.sock'}",
            f"--pid-file={directory / 'mysqld.pid'}", f"--log-error={directory / 'error.log'}", "--skip-grant-tables",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=64M", "--performance-schema=OFF", *as_root]
    server = TCPExecutor(args, host="127.0.0.1", port=port, timeout=_START_TIMEOUT, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start() -> None:
        ports_free([port])
        try:
            server.start()
        except Exception as exc:  # mirakuru's TimeoutExpired / ProcessExitedWithError: say what the server logged
            log = (directory / "error.log").read_text(errors="replace")[-2000:]
            raise Unavailable(f"private mariadbd did not start ({exc}): {log}") from None

    def restart(pause: float) -> None:
        server.stop()
        time.sleep(pause)
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
