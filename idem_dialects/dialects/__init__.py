"""Backend registry keyed by SQLAlchemy dialect name, open to third parties through an entry-point group.

A third-party package registers ``name = "module:Class"`` under the ``idem_dialects.backends`` entry-point group
(or calls `register` at import time); the class subclasses `idem_dialects.dialects.base.Backend`.
"""

from __future__ import annotations

import difflib
from importlib import import_module
from importlib.metadata import entry_points

from ..errors import UnsupportedEngine
from .base import Backend

ENTRY_POINT_GROUP = "idem_dialects.backends"

_registry: dict[str, str | type[Backend]] = {
    "sqlite": "idem_dialects.dialects.sqlite:SQLiteBackend",
    "postgresql": "idem_dialects.dialects.postgresql:PostgreSQLBackend",
    "mysql": "idem_dialects.dialects.mysql:MySQLBackend",
    "mariadb": "idem_dialects.dialects.mysql:MariaDBBackend",
    "mssql": "idem_dialects.dialects.mssql:MSSQLBackend",
    "oracle": "idem_dialects.dialects.oracle:OracleBackend",
}
_entry_points_loaded = False

# Names people type for a backend that SQLAlchemy spells differently (postgres:// was removed in SQLAlchemy 1.4).
ALIASES = {"postgres": "postgresql", "pg": "postgresql", "pgsql": "postgresql", "psql": "postgresql",
           "maria": "mariadb", "sqlserver": "mssql", "tsql": "mssql", "sqlite3": "sqlite", "oracledb": "oracle"}
# The extra that installs each backend's default driver, and the drivers it knows by their own package.
EXTRAS = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql", "mssql": "mssql", "oracle": "oracle"}
DRIVER_PACKAGES = {"psycopg": "idem-dialects[postgresql]", "psycopg2": "psycopg2-binary", "pg8000": "pg8000",
                   "asyncpg": "asyncpg", "pymysql": "idem-dialects[mysql]", "mysqldb": "mysqlclient",
                   "mysqlconnector": "mysql-connector-python", "mariadbconnector": "mariadb",
                   "pyodbc": "idem-dialects[mssql]", "mssqlpython": "mssql-python", "pymssql": "pymssql",
                   "oracledb": "idem-dialects[oracle]", "cx_oracle": "cx_Oracle"}


def register(name: str, backend: str | type[Backend]) -> None:
    """Register a backend for a SQLAlchemy dialect name, as a class or a lazy "module:Class" reference."""
    _registry[name] = backend


def _load_entry_points() -> None:
    global _entry_points_loaded
    if not _entry_points_loaded:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            _registry.setdefault(ep.name, ep.value)
        _entry_points_loaded = True


def names() -> list[str]:
    _load_entry_points()
    return sorted(_registry)


def load(name: str) -> type[Backend]:
    """The backend class for a dialect name; its module (and so its driver) is imported only now."""
    _load_entry_points()
    target = _registry.get(name)
    if target is None:
        raise UnsupportedEngine(name, sorted(_registry), did_you_mean(name))
    if isinstance(target, str):
        module_name, _, attr = target.partition(":")
        target = getattr(import_module(module_name), attr)
        if not (isinstance(target, type) and issubclass(target, Backend)):
            raise TypeError(f"{_registry[name]!r} registered for {name!r} is not a Backend subclass")
        _registry[name] = target
    return target


def did_you_mean(name: str) -> str:
    """A hint for an unknown backend name: the backend it is an alias of, or the closest known name."""
    guess = ALIASES.get(name.lower()) or next(iter(difflib.get_close_matches(name.lower(), names(), n=1)), None)
    return f"did you mean {guess}://?" if guess else ""


def install_hint(backend: str, driver: str) -> str:
    """How to install the driver a URL names (the default driver's extra, or the driver's own package)."""
    package = DRIVER_PACKAGES.get(driver)
    if package is None and backend in EXTRAS:
        package = f"idem-dialects[{EXTRAS[backend]}]"
    return f"pip install '{package}'" if package else f"install the Python driver for {backend}+{driver}"

