"""SQL Server through Microsoft's mssql-python driver (``mssql+mssqlpython://``, SQLAlchemy 2.1), without a server:
the URL builds a store without connecting, the claim compiles with that dialect, and errors are classified on real
mssql-python exception objects (which carry the SQLSTATE's description, not SQL Server's native number)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine, create_mock_engine, make_url
from sqlalchemy.exc import DBAPIError

from idem_dialects import IdempotencyStore, RetryCause, dialects
from idem_dialects.dialects.base import insert_values
from idem_dialects.dialects.classify import MISSING_TABLE
from idem_dialects.dialects.mssql import InsertIfAbsent, MSSQLBackend
from idem_dialects.dialects.mssql_errors import mssql_python_sqlstate
from idem_dialects.errors import CannotConnect, ConnectionConfigError
from idem_dialects.schema import build_tables

mssql_python = pytest.importorskip("mssql_python", reason="pip install 'idem-dialects[mssql]' (mssql-python)",
                                   exc_type=ImportError)
exceptions: Any = pytest.importorskip("mssql_python.exceptions")

URL = "mssql+mssqlpython://sa:pw@127.0.0.1:1/master?TrustServerCertificate=yes"  # port 1: nothing listens


def driver_error(state: str, text: str) -> DBAPIError:
    """A real mssql-python exception as the driver raises it for `state`, wrapped the way SQLAlchemy wraps it."""
    orig = exceptions.sqlstate_to_exception(state, f"[Microsoft][SQL Server]{text}")
    assert isinstance(orig, mssql_python.Error)
    return DBAPIError.instance("INSERT INTO idem_records ...", [], orig, mssql_python.Error)


def test_url_builds_a_store_without_connecting() -> None:
    store = IdempotencyStore.from_url(URL)
    assert type(store.backend) is dialects.load("mssql") and store.engine.url.drivername == "mssql+mssqlpython"
    assert store.features.max_identity_bytes == 1700
    store.close()


def test_claim_compiles_as_the_batch_with_this_dialect() -> None:
    mock = create_mock_engine(make_url(URL), lambda *a, **k: None)
    backend = MSSQLBackend(mock)  # type: ignore[arg-type]
    tables = build_tables("idem_", backend)
    values = insert_values(backend, tables.records, {"scope": 1, "operation": 1, "idem_key": 1}, {"created_at": 0})
    stmt = InsertIfAbsent(tables.records, values)
    sql = str(stmt.compile(dialect=mock.dialect))
    assert "SET XACT_ABORT OFF" in sql and "ERROR_NUMBER() IN (2627, 2601)" in sql


@pytest.mark.parametrize(("state", "text", "cause"), [
    ("40001", "Transaction (Process ID 53) was deadlocked on lock resources with another process", RetryCause.DEADLOCK),
    ("08S01", "Communication link failure", RetryCause.CONNECTION),
    ("23000", "Violation of PRIMARY KEY constraint 'idem_records_pk'", None),
    ("23000", "Cannot insert the value NULL into column 'status'", None),
    ("42000", "Incorrect syntax near 'x'", None),
])
def test_retry_causes_by_sqlstate(state: str, text: str, cause: RetryCause | None) -> None:
    backend = MSSQLBackend(create_mock_engine(make_url(URL), lambda *a, **k: None))  # type: ignore[arg-type]
    exc = driver_error(state, text)
    assert mssql_python_sqlstate(exc) == state
    assert backend.errors.retry_cause(exc) == cause
    assert not backend.errors.is_duplicate(exc)  # 23000 cannot tell a duplicate from NOT NULL: claims never ask


def test_missing_table_and_connect_errors() -> None:
    backend = MSSQLBackend(create_mock_engine(make_url(URL), lambda *a, **k: None))  # type: ignore[arg-type]
    missing = driver_error("42S02", "Invalid object name 'idem_records'.")
    assert backend.errors.config_problem(missing, ["idem_records"], None) == MISSING_TABLE
    # Connect errors come from an engine that connects (a mock engine has no URL for the classifier to read).
    connecting = MSSQLBackend(create_engine(URL))
    login = driver_error("28000", "Login failed for user 'sa'.")
    assert isinstance(connecting.errors.connect_error(login), ConnectionConfigError)
    unreachable = driver_error("08001", "TCP Provider: Error code 0x2749")
    assert isinstance(connecting.errors.connect_error(unreachable), CannotConnect)
    connecting.engine.dispose()
