"""Faults the library must tell apart: the effect's own error against cleanup errors after it, connections that
cannot open (retried as "connect") against configurations no retry fixes (fail at once with the fix), and
cancellations of the protocol's own waits (retried) against the effect's (never retried)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from idem_dialects_bench.workload import call_with_retry
from mssql_common import load_pyodbc
from sqlalchemy import create_engine, make_url
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from idem_dialects import (
    CannotConnect,
    ConnectionConfigError,
    IdempotencyStore,
    RetriesExhausted,
    RetryCause,
    RetryPolicy,
)
from idem_dialects.conformance.support import Effects, stores
from idem_dialects.dialects.mysql import MariaDBBackend
from idem_dialects.engines import Server, Unavailable, get
from idem_dialects.retry import EffectFailed

REQ = {"amount": 100}


def _pymysql() -> Any:
    """PyMySQL (the [mysql] extra), imported by the tests that build its errors: without it they skip, saying so."""
    return pytest.importorskip("pymysql", reason="PyMySQL is not installed (pip install 'idem-dialects[mysql]')")


def _dropped() -> OperationalError:
    return OperationalError("ROLLBACK", {}, ConnectionError("terminating connection"), connection_invalidated=True)


def _classify(exc: BaseException) -> RetryCause | None:
    if isinstance(exc, OperationalError):
        return RetryCause.CONNECTION
    return RetryCause.CANCELLED if isinstance(exc, TimeoutError) else None


# --- the effect's error wins -------------------------------------------------------------------------------------


def test_effect_error_is_not_replaced_by_a_failing_cleanup() -> None:
    """The effect raised, then the rollback raised a retryable error: the caller gets the effect's exception, with
    the rollback error as a note, after one call."""
    calls: list[int] = []
    effect_error = ValueError("payment provider said no")

    def attempt() -> None:
        calls.append(1)
        try:
            raise EffectFailed(effect_error)
        finally:
            raise _dropped()  # what a failing ROLLBACK in the transaction's __exit__ looks like

    with pytest.raises(ValueError) as err:
        call_with_retry(RetryPolicy(total=5), _classify, attempt)
    assert err.value is effect_error and calls == [1]
    assert any("not retried" in note and "OperationalError" in note for note in err.value.__notes__)


def test_effect_errors_retried_only_for_their_transaction() -> None:
    """An effect whose own statement lost its connection runs again (nothing of it committed); an effect whose
    statement was cancelled (statement timeout) does not: the cancellation reaches the caller unchanged."""
    calls: list[int] = []

    def lost_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise EffectFailed(_dropped())
        return "ok"

    assert call_with_retry(RetryPolicy(total=5), _classify, lost_once) == "ok" and len(calls) == 2
    cancelled = TimeoutError("canceling statement due to statement timeout")
    calls.clear()

    def cancelled_effect() -> None:
        calls.append(1)
        raise EffectFailed(cancelled)

    with pytest.raises(TimeoutError) as err:
        call_with_retry(RetryPolicy(total=5), _classify, cancelled_effect)
    assert err.value is cancelled and calls == [1]


def test_exhausted_effect_error_is_reported_unwrapped() -> None:
    def always() -> None:
        raise EffectFailed(_dropped())

    with pytest.raises(RetriesExhausted) as err:
        call_with_retry(RetryPolicy(total=0.05, initial=0.01, max_wait=0.02), _classify, always)
    assert isinstance(err.value.last_error, OperationalError) and err.value.__cause__ is err.value.last_error


def test_retries_exhausted_names_only_retries_that_happened() -> None:
    """One attempt and no retry: no "retried:"; three attempts: two retries, named with their causes."""
    def deadlock() -> None:
        raise _dropped()

    with pytest.raises(RetriesExhausted) as err:
        call_with_retry(RetryPolicy(max_attempts=1), _classify, deadlock)
    assert err.value.attempts == 1 and err.value.retried == {} and "retried" not in str(err.value)
    assert err.value.causes == {RetryCause.CONNECTION: 1}
    with pytest.raises(RetriesExhausted) as err:
        call_with_retry(RetryPolicy(max_attempts=3, initial=0.001, max_wait=0.002), _classify, deadlock)
    assert err.value.attempts == 3 and err.value.retried == {RetryCause.CONNECTION: 2}
    assert "retried: lost connection x2" in str(err.value) and err.value.causes == {RetryCause.CONNECTION: 3}


# --- connections that cannot open ---------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


# A server that does not listen, per backend: psycopg, PyMySQL, pyodbc with FreeTDS (08S01), oracledb thin (DPY-6005).
_CLOSED_PORT_URLS = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:{port}/test",
    "mariadb": "mariadb+pymysql://root@127.0.0.1:{port}/test",
    "mssql": "mssql+pyodbc://sa:pw@127.0.0.1:{port}/master?driver=FreeTDS&TDS_Version=7.4",
    "oracle": "oracle+oracledb://u:p@127.0.0.1:{port}/?service_name=FREEPDB1",
}


@pytest.mark.parametrize("backend", list(_CLOSED_PORT_URLS))
def test_closed_port_is_retried_as_connect_within_budget(backend: str) -> None:
    """A server that does not answer is retried within RetryPolicy.total as "connect", then RetriesExhausted."""
    if backend == "mssql" and "FreeTDS" not in load_pyodbc().drivers():
        pytest.skip("the FreeTDS ODBC driver is not installed (apt-get install tdsodbc)")
    if backend == "oracle":
        pytest.importorskip("oracledb")
    url = _CLOSED_PORT_URLS[backend].format(port=_closed_port())
    with IdempotencyStore.from_url(url, retry=RetryPolicy(total=2)) as store:
        with pytest.raises(RetriesExhausted) as err:
            store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "never")
    exhausted = err.value
    assert exhausted.attempts >= 2 and exhausted.causes == {RetryCause.CONNECT: exhausted.attempts}
    assert isinstance(exhausted.last_error, CannotConnect) and exhausted.last_error.cause == RetryCause.CONNECT
    assert dict(store.retries) == {RetryCause.CONNECT: exhausted.attempts - 1}


def test_missing_odbc_driver_fails_at_once_naming_it() -> None:
    """An mssql+pyodbc URL naming an ODBC driver that is not installed: ConnectionConfigError naming the driver
    (and the installed ones) on the first attempt, no retry."""
    load_pyodbc()
    url = "mssql+pyodbc://sa:secret@127.0.0.1:1433/master?driver=ODBC+Driver+99+for+SQL+Server"
    with IdempotencyStore.from_url(url, retry=RetryPolicy(total=30)) as store:
        with pytest.raises(ConnectionConfigError) as err:
            store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "never")
    assert "ODBC Driver 99 for SQL Server" in str(err.value) and "install" in str(err.value)
    assert "secret" not in str(err.value) and sum(store.retries.values()) == 0


def test_unknown_database_fails_at_once_with_the_fix() -> None:
    """MariaDB answers an unknown database with 1049: ConnectionConfigError on the first attempt, no retry."""
    try:
        server = get("mariadb").provide()
    except Unavailable as exc:
        pytest.skip(f"mariadb unavailable: {exc}")
    with IdempotencyStore.from_url(server.url.set(database="idem_no_such_db"), retry=RetryPolicy(total=30)) as store:
        with pytest.raises(ConnectionConfigError, match=r"database 'idem_no_such_db' does not exist.*database name"):
            store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "never")
        assert sum(store.retries.values()) == 0


def test_sqlite_file_that_cannot_open_is_a_configuration_error(tmp_path: Path) -> None:
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'missing' / 'x.db'}") as store:
        with pytest.raises(ConnectionConfigError, match="directory exists"):
            store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "never")
        assert sum(store.retries.values()) == 0


@pytest.mark.parametrize(("code", "kind"), [
    (2003, CannotConnect), (2013, CannotConnect), (1040, CannotConnect), (1047, CannotConnect),
    (1045, ConnectionConfigError), (1698, ConnectionConfigError), (1049, ConnectionConfigError),
])
def test_mysql_connect_errors_classified_by_code(code: int, kind: type[Exception]) -> None:
    pymysql = _pymysql()
    backend = MariaDBBackend(create_engine("mariadb+pymysql://u@localhost/db"))
    exc = OperationalError(None, None, pymysql.err.OperationalError(code, "text that is never read"))
    assert isinstance(backend.errors.connect_error(exc), kind)


def test_mysql_statement_codes() -> None:
    """1047 (Galera node not ready) is retried as connect; 1969/3024/1317 (statement cancelled) as cancelled."""
    pymysql = _pymysql()
    backend = MariaDBBackend(create_engine("mariadb+pymysql://u@localhost/db"))
    for code, cause in [(1047, RetryCause.CONNECT), (1969, RetryCause.CANCELLED), (3024, RetryCause.CANCELLED),
                        (1317, RetryCause.CANCELLED), (1927, RetryCause.CONNECTION)]:
        exc = OperationalError("SELECT 1", {}, pymysql.err.OperationalError(code, "x"))
        assert backend.errors.retry_cause(exc) == cause, code


# --- cancellation of the protocol's own wait on a key ------------------------------------------------------------


# A 150 ms statement timeout per engine: PostgreSQL statement_timeout (57014), MariaDB max_statement_time (1969).
_TIMEOUT_150MS = {
    "postgresql": {"connect_args": {"options": "-c statement_timeout=150"}},
    "mariadb": {"connect_args": {"init_command": "SET SESSION max_statement_time=0.15"}},
}
_SLEEP_1S = {"postgresql": "SELECT pg_sleep(1)", "mariadb": "SELECT SLEEP(1)"}


@pytest.fixture(scope="module", params=["postgresql-18", "postgresql", "mariadb"])
def timed(request: pytest.FixtureRequest) -> Iterator[Server]:
    """A server whose sessions get a 150 ms statement timeout (see _TIMEOUT_150MS)."""
    name: str = request.param
    try:
        server = get(name).provide()
    except Unavailable as exc:
        pytest.skip(f"{name} unavailable: {exc}")
    yield server
    server.stop()


def test_statement_timeout_waiters_replay(timed: Server) -> None:
    """A 150 ms statement timeout, a winner holding the key 600 ms, 4 duplicates waiting on it: the duplicates'
    claim statements are cancelled (PostgreSQL 57014, MariaDB 1969) and retried as "cancelled" until the winner
    commits; all 4 replay, 1 effect."""
    options = _TIMEOUT_150MS[timed.url.get_backend_name()]
    with stores(timed.url, f"stmt{threading.get_ident() % 10000}_") as make:
        store = make(**options)
        effects = Effects(store)
        effects.create()
        claimed = threading.Event()
        release = threading.Event()

        def winner_effect(conn: Connection) -> Any:
            claimed.set()
            # The winner's transaction holds the key at least 600 ms (no statement of its runs that long), and
            # until a waiter's claim was cancelled (MariaDB notices max_statement_time in a lock wait late).
            release.wait(0.6)
            for _ in range(1000):
                if store.retries[RetryCause.CANCELLED]:
                    break
                release.wait(0.01)
            return {"effect": effects.apply(conn, "k")}

        results: dict[str, Any] = {}
        errors: list[BaseException] = []

        def call(name: str, effect: Any) -> None:
            try:
                results[name] = store.run(scope="s", operation="op", key="k", request=REQ, effect=effect)
            except BaseException as exc:
                errors.append(exc)

        winner = threading.Thread(target=call, args=("winner", winner_effect))
        winner.start()
        assert claimed.wait(30)
        waiters = [threading.Thread(target=call, args=(f"w{i}", effects.effect("k"))) for i in range(4)]
        for thread in waiters:
            thread.start()
        for thread in [winner, *waiters]:
            thread.join(60)
        effects_count = effects.count("k")
        effects.drop()
    assert errors == []
    assert effects_count == 1 and not results["winner"].replayed
    assert all(results[f"w{i}"].replayed for i in range(4))
    assert store.retries[RetryCause.CANCELLED] >= 1, dict(store.retries)


def test_effect_statement_cancelled_is_not_retried(timed: Server) -> None:
    """The effect's own statement cancelled by the statement timeout reaches the caller unchanged after one call."""
    backend = timed.url.get_backend_name()
    with stores(timed.url, f"stmc{threading.get_ident() % 10000}_") as make:
        store = make(**_TIMEOUT_150MS[backend])
        calls: list[int] = []

        def effect(conn: Connection) -> Any:
            calls.append(1)
            conn.exec_driver_sql(_SLEEP_1S[backend])

        with pytest.raises(OperationalError) as err:
            store.run(scope="s", operation="op", key="k", request=REQ, effect=effect)
    assert store.retry_cause(err.value) == RetryCause.CANCELLED and calls == [1]


@pytest.mark.parametrize(("state", "kind"), [
    ("IM002", ConnectionConfigError), ("01000", ConnectionConfigError), ("28000", ConnectionConfigError),
    ("08001", CannotConnect), ("08S01", CannotConnect), ("HYT00", CannotConnect),
])
def test_mssql_connect_errors_classified_by_sqlstate(state: str, kind: type[Exception]) -> None:
    """pyodbc's connect errors by ODBC SQLSTATE: a missing driver or DSN and a failed login are configuration;
    an unreachable server or a login timeout is retried as connect."""
    pyodbc = load_pyodbc()
    from sqlalchemy.exc import DBAPIError

    from idem_dialects.dialects.mssql import MSSQLBackend

    backend = MSSQLBackend(create_engine("mssql+pyodbc://sa:pw@dbhost:1433/master?driver=FreeTDS"))
    orig = pyodbc.Error(state, f"[{state}] [unixODBC]text that is never read (0) (SQLDriverConnect)")
    assert isinstance(backend.errors.connect_error(DBAPIError.instance(None, None, orig, pyodbc.Error)), kind)


@pytest.mark.parametrize(("code", "kind"), [
    (1017, ConnectionConfigError), (12514, ConnectionConfigError), (28000, ConnectionConfigError),
    (12541, CannotConnect), (1033, CannotConnect), (12528, CannotConnect),
])
def test_oracle_connect_errors_classified_by_number(code: int, kind: type[Exception]) -> None:
    """python-oracledb's connect errors by ORA number (the real driver exception objects)."""
    pytest.importorskip("oracledb")
    import importlib

    from sqlalchemy.exc import DBAPIError

    from idem_dialects.dialects.oracle import OracleBackend

    errors = importlib.import_module("oracledb.errors")
    err = errors._Error(f"ORA-{code:05d}: text that is never read", code=code, offset=0)
    backend = OracleBackend(create_engine("oracle+oracledb://u:p@dbhost:1521/?service_name=FREEPDB1"))
    assert isinstance(backend.errors.connect_error(DBAPIError.instance(None, None, err.exc_type(err), Exception)),
                      kind)


@pytest.mark.parametrize(("query", "options"), [
    ("?target_session_attrs=standby", {}),  # libpq refuses a session that is not what was asked for (no SQLSTATE)
    ("", {"connect_args": {"options": "-c default_transaction_read_only=on"}}),  # 25006 on the claim's INSERT
], ids=["session-attrs", "read-only-25006"])
def test_postgresql_wrong_session_kind_is_retried_as_connect(query: str, options: dict[str, Any]) -> None:
    """A session that cannot write (the server a failover left read-only, or not the kind target_session_attrs asks
    for) is retried as connect within the budget: a new connection may reach the new primary."""
    try:
        server = get("postgresql").provide()
    except Unavailable as exc:
        pytest.skip(f"postgresql unavailable: {exc}")
    with stores(server.url, f"ro{threading.get_ident() % 10000}_") as make:
        make()  # creates the tables, on a session that can write
        store = make(make_url(server.url.render_as_string(hide_password=False) + query), **options)
        with pytest.raises(RetriesExhausted) as err:
            store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "never",
                      retry=RetryPolicy(total=0.3))
    assert err.value.causes == {RetryCause.CONNECT: err.value.attempts}


# --- the fault proxy's protocol readers ------------------------------------------------------------------------------


def _pg(kind: bytes, body: bytes) -> bytes:
    return kind + (len(body) + 4).to_bytes(4, "big") + body


def test_fault_proxy_reads_postgresql_statements() -> None:
    """SSLRequest and startup pass through; 'Q' and 'E' (with the text its portal's 'P' parsed) are statements;
    a round trip ends at 'Q' or 'S'; a message split across reads is reassembled."""
    from idem_dialects.conformance.faultproxy import _PostgreSQL

    reader = _PostgreSQL()
    ssl = (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big")
    startup = (16).to_bytes(4, "big") + (196608).to_bytes(4, "big") + b"user\0pg\0"
    stream = bytearray(ssl + startup + _pg(b"Q", b"BEGIN\0") + _pg(b"P", b"\0INSERT INTO t VALUES ($1)\0\0\0")
                       + _pg(b"B", b"\0\0\0\0\0\0\0\0") + _pg(b"E", b"\0\0\0\0\0") + _pg(b"S", b""))
    tail = stream[-7:]
    del stream[-7:]
    seen = reader.split(stream)
    stream += tail
    seen += reader.split(stream)
    assert [(sql, end) for sql, _, end in seen] == [
        (None, False), (None, False), ("BEGIN", True), (None, False), (None, False),
        ("INSERT INTO t VALUES ($1)", False), (None, True)]
    assert not stream


def test_fault_proxy_reads_mysql_statements() -> None:
    """COM_QUERY at the start of a command sequence is a statement; auth packets (sequence > 0) are not."""
    from idem_dialects.conformance.faultproxy import _MySQL

    def packet(seq: int, payload: bytes) -> bytes:
        return len(payload).to_bytes(3, "little") + bytes([seq]) + payload

    stream = bytearray(packet(1, b"\x03not a query: handshake response") + packet(0, b"\x03COMMIT")
                       + packet(0, b"\x0e"))
    assert [sql for sql, _, _ in _MySQL().split(stream)] == [None, "COMMIT", None]
