"""Failures to open a connection, classified per engine for every sync and async driver by error class, SQLSTATE or
driver error code (never by message text): transient (refused, reset, too many connections, the server starting or
stopping) -> CannotConnect, retried by `run`; configuration (wrong password, unknown user, database or host, a
missing SQLite directory, a missing system library) -> ConnectionConfigError naming the fix. Unit tests construct the
drivers' real exception objects; live tests reach the servers this machine runs."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

import idem_dialects
from idem_dialects import IdempotencyStore, Result, RetriesExhausted, RetryCause, RetryPolicy
from idem_dialects.dialects import install_hint, postgresql_errors
from idem_dialects.dialects.base import Backend
from idem_dialects.dialects.mssql import MSSQLBackend
from idem_dialects.dialects.mysql import MariaDBBackend, MySQLBackend
from idem_dialects.dialects.oracle import OracleBackend
from idem_dialects.dialects.postgresql import PostgreSQLBackend
from idem_dialects.dialects.sqlite import SQLiteBackend
from idem_dialects.drivers import LIBLTDL, UNIXODBC
from idem_dialects.errors import CannotConnect, ConnectionConfigError, MissingDriver

CONFIG, TRANSIENT = ConnectionConfigError, CannotConnect
REQ = {"amount": 1}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


CLOSED = _closed_port()


def engine(url: str) -> Engine:
    """The sync engine a store's backend sees: create_async_engine's sync facade for an async driver."""
    try:
        from sqlalchemy.ext.asyncio import create_async_engine  # needs greenlet: only for an async URL

        return create_async_engine(url).sync_engine
    except Exception:  # not an async driver
        return create_engine(url)


def wrapped(orig: BaseException, cause: BaseException | None = None) -> DBAPIError:
    """`orig` as SQLAlchemy raises it from a failed connect (what the sync store and SQLAlchemy's adapters see)."""
    if cause is not None:
        orig.__cause__ = cause
    return DBAPIError.instance(None, None, orig, Exception)  # type: ignore[return-value]


def classify(backend: type[Backend], url: str, exc: BaseException) -> type[Exception] | None:
    problem = backend(engine(url)).errors.connect_error(exc)
    return None if problem is None else type(problem)


# --- PostgreSQL: psycopg (sync and async), psycopg2, pg8000, asyncpg ------------------------------------------------

psycopg: Any = pytest.importorskip("psycopg")
PG_CLOSED = f"postgresql+psycopg://postgres@127.0.0.1:{CLOSED}/test"


@pytest.mark.parametrize(("code", "kind"), [
    ("53300", TRANSIENT), ("57P03", TRANSIENT), ("57P01", TRANSIENT), ("08006", TRANSIENT), ("08001", TRANSIENT),
    ("28P01", CONFIG), ("28000", CONFIG), ("3D000", CONFIG), ("42501", CONFIG),
])
def test_postgresql_sqlstates(code: str, kind: type[Exception]) -> None:
    """The same SQLSTATE means the same thing from every driver that reports it: psycopg 3 (sync and async),
    asyncpg raw and as SQLAlchemy wraps it, pg8000's error dict."""
    asyncpg: Any = pytest.importorskip("asyncpg")
    pg8000: Any = pytest.importorskip("pg8000")
    raw_asyncpg = next(c for c in _subclasses(asyncpg.exceptions.PostgresError)
                       if getattr(c, "sqlstate", None) == code)("never read")
    pg8000_error = pg8000.dbapi.InterfaceError({"S": "FATAL", "C": code, "M": "never read"})
    for url, exc in [(PG_CLOSED, wrapped(psycopg.errors.lookup(code)("never read"))),
                     (f"postgresql+asyncpg://u@127.0.0.1:{CLOSED}/db", raw_asyncpg),
                     (f"postgresql+asyncpg://u@127.0.0.1:{CLOSED}/db", wrapped(raw_asyncpg)),
                     (f"postgresql+pg8000://u@127.0.0.1:{CLOSED}/db", wrapped(pg8000_error))]:
        assert classify(PostgreSQLBackend, url, exc) is kind, (url, exc)


def _subclasses(cls: type) -> list[type]:
    found = [cls]
    sub: type
    for sub in cls.__subclasses__():
        found += _subclasses(sub)
    return found


@pytest.mark.parametrize("driver", ["asyncpg", "pg8000"])
def test_postgresql_socket_causes(driver: str) -> None:
    """asyncpg raises the socket error itself; pg8000 chains it under its InterfaceError: a refused or reset socket,
    a missing Unix socket or a DNS hiccup is transient, a host name that does not exist is configuration."""
    pytest.importorskip(driver)
    url = f"postgresql+{driver}://u@127.0.0.1:{CLOSED}/db"
    pg8000: Any = pytest.importorskip("pg8000") if driver == "pg8000" else None
    for cause, kind in [(ConnectionRefusedError(111, "refused"), TRANSIENT), (ConnectionResetError(104, "reset"),
                        TRANSIENT), (FileNotFoundError(2, "no socket"), TRANSIENT), (TimeoutError(), TRANSIENT),
                        (socket.gaierror(socket.EAI_AGAIN, "try again"), TRANSIENT),
                        (socket.gaierror(socket.EAI_NONAME, "unknown"), CONFIG)]:
        exc = cause if pg8000 is None else wrapped(pg8000.exceptions.InterfaceError("never read"), cause)
        assert classify(PostgreSQLBackend, url, exc) is kind, (driver, cause)


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_libpq_errors_without_sqlstate_ask_the_server(driver: str) -> None:
    """libpq (psycopg sync and async, psycopg2) reports a refused startup without its SQLSTATE: the backend asks the
    server once more by protocol. Nothing listening: transient; a host name that does not resolve: configuration."""
    module: Any = pytest.importorskip(driver)
    exc = wrapped(module.OperationalError("connection failed: never read"))
    assert classify(PostgreSQLBackend, f"postgresql+{driver}://u@127.0.0.1:{CLOSED}/db", exc) is TRANSIENT
    assert classify(PostgreSQLBackend, f"postgresql+{driver}://u@host.invalid:5432/db", exc) is CONFIG
    # A multi-host URL is not asked (a failover refuses by design): transient.
    assert classify(PostgreSQLBackend, f"postgresql+{driver}://u@/db?host=a.invalid:1&host=b.invalid:2", exc) is \
        TRANSIENT


def test_psycopg_password_needed_is_configuration() -> None:
    """psycopg 3 knows without a SQLSTATE that the server asked for a password and none was given."""

    class PGconn:  # the attributes of psycopg.pq.PGconn that libpq fills for a failed connection
        needs_password, used_password = True, False

    error = psycopg.OperationalError("never read", pgconn=PGconn())
    assert classify(PostgreSQLBackend, PG_CLOSED, wrapped(error)) is CONFIG


# --- MySQL / MariaDB: PyMySQL, mysql-connector, asyncmy -------------------------------------------------------------


def _mysql_errors(code: int) -> list[tuple[str, BaseException]]:
    """The driver error each MySQL driver raises for server or client error `code` (as SQLAlchemy wraps it)."""
    found: list[tuple[str, BaseException]] = []
    pymysql: Any = pytest.importorskip("pymysql")
    found.append(("pymysql", wrapped(pymysql.err.OperationalError(code, "never read"))))
    try:
        from mysql.connector import errors as connector

        found.append(("mysqlconnector", wrapped(connector.DatabaseError(msg="never read", errno=code))))
    except ImportError:
        pass
    try:
        import asyncmy.errors

        found.append(("asyncmy", wrapped(asyncmy.errors.OperationalError(code, "never read"))))
    except ImportError:
        pass
    return found


@pytest.mark.parametrize("backend", [MySQLBackend, MariaDBBackend])
@pytest.mark.parametrize(("code", "kind"), [
    (2003, TRANSIENT), (2013, TRANSIENT), (2006, TRANSIENT), (1040, TRANSIENT), (1203, TRANSIENT),
    (1053, TRANSIENT), (1045, CONFIG), (1698, CONFIG), (1044, CONFIG), (1049, CONFIG), (2005, CONFIG),
])
def test_mysql_codes_for_every_driver(backend: type[Backend], code: int, kind: type[Exception]) -> None:
    for driver, exc in _mysql_errors(code):
        url = f"{backend.name}+{driver}://u@127.0.0.1:{CLOSED}/db"
        assert classify(backend, url, exc) is kind, (driver, code)


def test_mysql_unknown_host_is_told_apart_from_refused() -> None:
    """PyMySQL and asyncmy report both as 2003; the socket error under it (PyMySQL's original_exception, a cause
    elsewhere) says which."""
    pymysql: Any = pytest.importorskip("pymysql")
    url = f"mariadb+pymysql://u@127.0.0.1:{CLOSED}/db"
    for cause, kind in [(socket.gaierror(socket.EAI_NONAME, "unknown"), CONFIG),
                        (ConnectionRefusedError(111, "refused"), TRANSIENT)]:
        orig = pymysql.err.OperationalError(2003, "never read")
        orig.original_exception = cause
        assert classify(MariaDBBackend, url, wrapped(orig)) is kind
        assert classify(MariaDBBackend, url, wrapped(pymysql.err.OperationalError(2003, "never read"), cause)) is kind


# --- SQLite, SQL Server, Oracle --------------------------------------------------------------------------------------


def test_sqlite_cannot_open_for_both_drivers(tmp_path: Path) -> None:
    """sqlite3 and aiosqlite (which raises sqlite3's own error) both carry SQLITE_CANTOPEN."""
    import sqlite3

    with pytest.raises(sqlite3.OperationalError) as err:
        sqlite3.connect(tmp_path / "missing" / "x.db")
    for url in (f"sqlite:///{tmp_path}/missing/x.db", f"sqlite+aiosqlite:///{tmp_path}/missing/x.db"):
        assert classify(SQLiteBackend, url, wrapped(err.value)) is CONFIG
        assert classify(SQLiteBackend, url, err.value) is CONFIG


@pytest.mark.parametrize(("full_code", "kind"), [
    ("DPY-6005", TRANSIENT), ("DPY-6000", TRANSIENT), ("DPY-4011", TRANSIENT), ("DPY-6001", CONFIG),
    ("DPY-6003", CONFIG),
])
def test_oracledb_thin_codes_sync_and_async(full_code: str, kind: type[Exception]) -> None:
    """python-oracledb's own DPY codes (thin mode, its sync and async connections alike), on real exception
    objects, and the socket error under DPY-6005 where there is one."""
    pytest.importorskip("oracledb")
    import importlib

    errors = importlib.import_module("oracledb.errors")
    err = errors._create_err(int(full_code[4:]), service_name="x", sid="x", host="h", port=1, error_code=12514,
                             connection_id=1)
    assert err.full_code == full_code
    url = "oracle+oracledb://u:p@127.0.0.1:1/?service_name=x"
    for made in (create_engine(url), engine(url)):
        assert type(OracleBackend(made).errors.connect_error(wrapped(err.exc_type(err)))) is kind
    unknown_host = wrapped(err.exc_type(err), socket.gaierror(socket.EAI_NONAME, "unknown"))
    assert type(OracleBackend(create_engine(url)).errors.connect_error(unknown_host)) is (
        CONFIG if kind is TRANSIENT else kind)


def test_mssql_python_without_libltdl_names_the_library() -> None:
    """mssql-python's bundled ODBC driver needs libltdl.so.7 when the first connection opens; where it is missing,
    the connect failure (no SQLSTATE) is a ConnectionConfigError naming the library and its Debian package."""
    mssql_python: Any = pytest.importorskip("mssql_python")
    if not LIBLTDL.missing():
        pytest.skip("libltdl.so.7 is installed here: the driver loads")
    url = "mssql+mssqlpython://sa:pw@127.0.0.1:1/master?TrustServerCertificate=yes"
    with pytest.raises(mssql_python.OperationalError) as err:
        mssql_python.connect("Server=127.0.0.1,1;UID=sa;PWD=x;TrustServerCertificate=yes")
    problem = MSSQLBackend(engine(url)).errors.connect_error(wrapped(err.value))
    assert isinstance(problem, MissingDriver) and problem.library == "libltdl.so.7"  # as pyodbc without unixODBC
    assert "apt-get install libltdl7" in str(problem) and "pip install 'pymssql'" in str(problem)


def test_install_hints_name_missing_system_libraries() -> None:
    """The one install hint names the extra or package and, where a system library is missing, the library and the
    Debian package that brings it."""
    assert install_hint("postgresql", "pg8000") == "pip install 'pg8000'"
    assert install_hint("postgresql", "unknown") == "pip install 'idem-dialects[postgresql]'"
    assert install_hint("db2", "ibm_db") == "install the Python driver for db2+ibm_db"
    for driver, library in [("pyodbc", UNIXODBC), ("aioodbc", UNIXODBC), ("mssqlpython", LIBLTDL)]:
        hint = install_hint("mssql", driver)
        known = idem_dialects.dialects.driver(MSSQLBackend, driver)
        assert known is not None
        # an installed driver missing only its library is told to install the library, not the package again
        extra = "aioodbc" if driver == "aioodbc" else "mssql"  # the async driver is an extra of its own
        package_named = hint.startswith(f"pip install 'idem-dialects[{extra}]'")
        assert package_named == (not known.installed() or not library.missing())
        assert (library.soname in hint and f"apt-get install {library.debian}" in hint) == library.missing()


# --- async drivers' connections lost mid-statement ------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "url"), [
    (PostgreSQLBackend, "postgresql+asyncpg://u@h/db"), (MariaDBBackend, "mariadb+asyncmy://u@h/db"),
    (SQLiteBackend, "sqlite+aiosqlite:///x.db")])
def test_async_mid_statement_losses_are_retried_as_lost_connections(backend: type[Backend], url: str) -> None:
    """A socket an async driver lost mid-statement and raised as it is (no DBAPI wrapper) is a lost connection, as
    the sync drivers' are; asyncpg's own connection errors by their SQLSTATE class (08)."""
    b = backend(engine(url))
    for exc in (ConnectionResetError(104, "reset"), BrokenPipeError(32, "pipe"), ConnectionAbortedError()):
        assert b.errors.retry_cause(exc) == RetryCause.CONNECTION
    assert b.errors.retry_cause(OSError(2, "not a connection")) is None and b.errors.retry_cause(ValueError()) is None
    if backend is PostgreSQLBackend:
        asyncpg: Any = pytest.importorskip("asyncpg")
        assert b.errors.retry_cause(asyncpg.exceptions.ConnectionDoesNotExistError("gone")) == RetryCause.CONNECTION
        assert b.errors.retry_cause(asyncpg.exceptions.AdminShutdownError("stop")) == RetryCause.CONNECTION


# --- live: every driver on the servers this machine runs --------------------------------------------------------------


def _live(url: str, asynchronous: bool) -> BaseException:
    """What `run` raises against `url` (one attempt's budget: configuration errors never retry)."""
    policy = RetryPolicy(total=0.5)
    try:
        if asynchronous:
            async def go() -> None:
                try:
                    async with idem_dialects.AsyncIdempotencyStore.from_url(url, retry=policy) as store:
                        async def effect(conn: Any) -> str:
                            return "never"

                        await store.run(scope="s", operation="op", key="k", request=REQ, effect=effect)
                finally:
                    # aiosqlite's thread answers the stop request of a connection that failed to open on this loop:
                    # let it, before asyncio.run closes the loop under it.
                    await asyncio.sleep(0.1)

            asyncio.run(go())
        else:
            with IdempotencyStore.from_url(url, retry=policy) as store:
                store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "never")
    except Exception as exc:
        return exc
    raise AssertionError(f"{url}: run did not fail")


def _service(port: int) -> None:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        pytest.skip(f"no server listens on 127.0.0.1:{port} here")


LIVE_DRIVERS = [("postgresql", d, a, 5432, "postgres") for d, a in
                [("psycopg", False), ("psycopg2", False), ("pg8000", False), ("asyncpg", True), ("psycopg", True)]] + \
               [("mariadb", d, a, 3306, "root") for d, a in [("pymysql", False), ("mysqlconnector", False),
                                                             ("asyncmy", True)]]


@pytest.mark.parametrize(("backend", "driver", "asynchronous", "port", "user"), LIVE_DRIVERS,
                         ids=[f"{b}+{d}{'-async' if a else ''}" for b, d, a, _, _ in LIVE_DRIVERS])
def test_live_connect_failures(backend: str, driver: str, asynchronous: bool, port: int, user: str) -> None:
    """On the machine's PostgreSQL 15 and MariaDB: an unknown database, an unknown user and a host name that does not
    resolve fail at once with ConnectionConfigError, as does a libpq option the server's answer cannot meet (GSSAPI
    encryption without credentials); a port nothing listens on is retried as connect until the
    budget ends (RetriesExhausted whose last error is CannotConnect), never a raw driver error."""
    module = {"mysqlconnector": "mysql.connector"}.get(driver, driver)
    pytest.importorskip(module)
    _service(port)
    base = f"{backend}+{driver}://"
    cases: list[tuple[str, Callable[[BaseException], bool]]] = [
        (f"{base}{user}@127.0.0.1:{port}/idem_no_such_db", _config("database")),
        (f"{base}idem_no_such_user@127.0.0.1:{port}/test", _config("")),
        (f"{base}{user}@host.invalid:{port}/test", _config("host")),
        (f"{base}{user}@127.0.0.1:{CLOSED}/test", _exhausted),
    ]
    if backend == "mariadb":
        cases.append((f"{base}{user}:wrong-password@127.0.0.1:{port}/test", _config("password")))
    if driver in ("psycopg", "psycopg2"):  # libpq itself refuses what the server would accept: no Kerberos here
        cases.append((f"{base}{user}@127.0.0.1:{port}/test?gssencmode=require", _config("gssencmode")))
    for url, ok in cases:
        exc = _live(url, asynchronous)
        assert ok(exc), f"{url}: {type(exc).__name__}: {exc}"


def _config(word: str) -> Callable[[BaseException], bool]:
    return lambda exc: isinstance(exc, ConnectionConfigError) and word in str(exc)


def _exhausted(exc: BaseException) -> bool:
    return isinstance(exc, RetriesExhausted) and isinstance(exc.last_error, CannotConnect)


@pytest.mark.parametrize("driver", ["pysqlite", "aiosqlite"])
def test_live_sqlite_missing_directory(driver: str, tmp_path: Path) -> None:
    if driver == "aiosqlite":
        pytest.importorskip("aiosqlite")
    exc = _live(f"sqlite+{driver}:///{tmp_path}/missing/x.db", driver == "aiosqlite")
    assert isinstance(exc, ConnectionConfigError) and "directory exists" in str(exc)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["psycopg", "psycopg-async"])
def test_too_many_connections_freed_before_the_probe_is_retried(asynchronous: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """libpq reports "too many connections" (53300) without its SQLSTATE, so the backend asks the server again; when a
    slot frees in between, the server accepts that probe. With a driver option in the URL (sslmode) this once read as
    libpq refusing the options: a ConnectionConfigError, never retried, for a transient overload. Real role with
    CONNECTION LIMIT 1 on the machine's PostgreSQL 15, its one slot held, freed just before the probe: the request
    is retried and its effect applied exactly once."""
    _service(5432)
    role = f"idem_one_slot_{os.getpid()}"

    def tables(conn: Any) -> list[str]:  # this test's own: other tests' tables share the database
        return [r[0] for r in conn.execute(text(f"SELECT tablename FROM pg_tables WHERE tablename LIKE '{role}\\_%'"))]

    admin = create_engine("postgresql+psycopg://postgres@127.0.0.1:5432/test", isolation_level="AUTOCOMMIT")
    prefix = f"{role}_"
    url = f"postgresql+psycopg://{role}@127.0.0.1:5432/test?sslmode=prefer"
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1"))
        with IdempotencyStore.from_url(admin.url.render_as_string(hide_password=False),
                                       table_prefix=prefix) as owner:
            owner.create_tables()
        with admin.connect() as conn:
            for table in tables(conn):
                conn.execute(text(f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{table}" TO {role}'))
        filler = psycopg.connect(host="127.0.0.1", dbname="test", user=role)  # the role's one slot
        probe = postgresql_errors.startup_sqlstate
        probed: list[object] = []

        def slot_freed_first(target: Any) -> Any:
            # The session holding the slot ends between libpq's refusal and the probe; with a timeout,
            # pg_terminate_backend returns once that backend is gone, its slot free for the probe.
            with admin.connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": filler.info.backend_pid})
            filler.close()
            probed.append(answer := probe(target))
            return answer

        monkeypatch.setattr(postgresql_errors, "startup_sqlstate", slot_freed_first)
        applied: list[int] = []
        policy = RetryPolicy(total=10)
        if asynchronous:
            async def go() -> Result:
                async with idem_dialects.AsyncIdempotencyStore.from_url(url, table_prefix=prefix,
                                                                        retry=policy) as store:
                    async def effect(conn: Any) -> str:
                        applied.append(1)
                        return "done"

                    return await store.run(scope="s", operation="op", key="k", request=REQ, effect=effect)

            outcome = asyncio.run(go())
        else:
            with IdempotencyStore.from_url(url, table_prefix=prefix, retry=policy) as store:
                outcome = store.run(scope="s", operation="op", key="k", request=REQ,
                                    effect=lambda conn: applied.append(1) or "done")
        assert probed == [postgresql_errors.ACCEPTED]  # the race this test is about happened
        assert outcome == Result(response="done", status=200, replayed=False) and applied == [1]
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"))
            for table in tables(conn):
                conn.execute(text(f'DROP TABLE "{table}" CASCADE'))
            conn.execute(text(f"DROP ROLE IF EXISTS {role}"))  # its grants went with the tables
        admin.dispose()
