"""testcontainers: the last resort to provide an engine, when a Docker engine answers."""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL

from .servers import Provider, Server, Unavailable, described

if TYPE_CHECKING:
    from .catalogue import EngineSpec

_PASSWORD = "Idem-dialects-1"  # meets SQL Server's complexity rule; containers are throwaway and local
_docker_checked: dict[str | None, str | None] = {}


def image_var(name: str) -> str:
    """The environment variable that overrides an engine's container image: IDEM_IMAGE_<NAME>."""
    return "IDEM_IMAGE_" + name.upper().replace("-", "_").replace(".", "_")


def _unix_socket_problem(host: str) -> str | None:
    """Why a ``unix://`` Docker host cannot be connected to (None if it can, or if it is not a unix socket)."""
    if not host.startswith("unix://"):
        return None
    path = host.removeprefix("unix://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(path)
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
    return None


def _ping() -> str | None:
    """Why the Docker engine of the environment does not answer a ping (2 s at most), or None if it does."""
    import docker  # imported by docker_reachable's check first

    try:
        client = docker.from_env(timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # the SDK wraps socket, HTTP and TLS failures in assorted types
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return text if len(text) <= 160 else text[:157] + "..."
    return None


def docker_reachable() -> None:
    """Raise Unavailable unless testcontainers is installed and a Docker engine answers a ping (2 s at most)."""
    try:
        with warnings.catch_warnings():  # platformdirs/testcontainers warn about unset XDG dirs on import
            warnings.simplefilter("ignore")
            import docker  # noqa: F401  # only when a container provider is tried
            import testcontainers  # noqa: F401
    except ImportError:
        raise Unavailable("testcontainers is not installed (pip install 'idem-dialects[containers]')") from None
    cache_key = os.environ.get("DOCKER_HOST")
    if cache_key is None and not Path("/var/run/docker.sock").exists():
        raise Unavailable("Docker engine not reachable for testcontainers (DOCKER_HOST is unset and there is no"
                          " /var/run/docker.sock)")
    if cache_key not in _docker_checked:
        # A failed connect through the Docker SDK leaks its socket: try a unix socket ourselves first.
        _docker_checked[cache_key] = _unix_socket_problem(cache_key or "unix:///var/run/docker.sock") or _ping()
    problem = _docker_checked[cache_key]
    if problem is not None:
        raise Unavailable(f"Docker engine not reachable for testcontainers ({problem})")


def _need(module: str, extra: str) -> None:
    try:
        __import__(module)
    except ModuleNotFoundError:
        raise Unavailable(f"the {module} driver is not installed (pip install 'idem-dialects[{extra}]')") from None
    except ImportError as exc:  # installed, but a system library it needs is missing (pyodbc without unixODBC)
        raise Unavailable(f"the {module} driver cannot load: {exc}") from None


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
    described(f"a testcontainers container of {image} (needs Docker)")(provide)
    return provide
