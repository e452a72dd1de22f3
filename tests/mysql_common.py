"""MySQL/MariaDB test fixtures and helpers shared by tests/test_mysql*.py: servers from the engine catalogue, databases
with hostile charsets and collations, and stores through both backend names (skipped without PyMySQL)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from idem_dialects import IdempotencyStore

pymysql = pytest.importorskip("pymysql", reason="PyMySQL is not installed (pip install 'idem-dialects[mysql]')")

REQ = {"amount": 1}
BACKENDS = ["mariadb", "mysql"]


@dataclass(frozen=True)
class LiveServer:
    url: URL
    is_mariadb: bool


@pytest.fixture(scope="module", params=["mariadb", "mysql-8.4"])
def server(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """A server from the engine catalogue: the machine's MariaDB, and MySQL 8.4 when a URL or Docker gives one."""
    from idem_dialects.engines import Unavailable, get

    try:
        provided = get(request.param).provide()
    except Unavailable as exc:
        pytest.skip(f"{request.param} unavailable: {exc}")
    try:
        url: URL = provided.url
        engine = create_engine(url.set(drivername="mysql+pymysql"))
        try:
            with engine.connect() as conn:
                version = str(conn.exec_driver_sql("SELECT VERSION()").scalar_one())
        except DBAPIError as exc:
            pytest.skip(f"{request.param} at {url.render_as_string()} refused us: {exc.orig}")
        finally:
            engine.dispose()
        yield LiveServer(url, "mariadb" in version.lower())
    finally:
        provided.stop()


@pytest.fixture(scope="module")
def server_url(server: LiveServer) -> URL:
    return server.url


@pytest.fixture(scope="module")
def admin(server_url: URL) -> Iterator[Engine]:
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


def _url(server_url: URL, backend: str, database: str | None = None, **query: str) -> URL:
    url = server_url.set(drivername=f"{backend}+pymysql")
    if database is not None:
        url = url.set(database=database)
    return url.update_query_dict(query) if query else url


@pytest.fixture(scope="module")
def make_database(admin: Engine) -> Iterator[Callable[[str], str]]:
    """Databases with a given default character set / collation, dropped at the end of the module."""
    made: list[str] = []

    def make(options: str) -> str:
        name = f"idem_t_{secrets.token_hex(4)}"
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(f"CREATE DATABASE {name} {options}")
        except DBAPIError as exc:
            pytest.skip(f"this server's user may not create databases: {exc.orig}")
        made.append(name)
        return name

    yield make
    with admin.connect() as conn:
        for name in made:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")


@pytest.fixture
def make_store(server: LiveServer) -> Iterator[Callable[..., IdempotencyStore]]:
    """Stores on fresh tables (one prefix per test); keyword `database`, `charset` and engine options."""
    prefix = f"m{secrets.token_hex(3)}_"
    made: list[IdempotencyStore] = []
    server_url = server.url

    def make(backend: str = "mariadb", database: str | None = None, charset: str | None = None,
             **engine_options: Any) -> IdempotencyStore:
        if backend == "mariadb" and not server.is_mariadb:
            pytest.skip("the mariadb backend (mariadb+pymysql) connects only to MariaDB servers")
        query = {"charset": charset} if charset else {}
        store = IdempotencyStore.from_url(_url(server_url, backend, database, **query), table_prefix=prefix,
                                          **engine_options)
        if not any(s.engine.url.database == store.engine.url.database for s in made):
            store.create_tables()
        made.append(store)
        return store

    yield make
    dropped: set[str | None] = set()
    for store in made:
        if store.engine.url.database not in dropped:
            store.drop_tables()
            dropped.add(store.engine.url.database)
        store.engine.dispose()


def _respond(value: Any) -> Callable[[Connection], Any]:
    return lambda conn: value


def _records(store: IdempotencyStore) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(select(store.tables.records)).all())
