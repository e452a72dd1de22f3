"""on_in_flight="conflict" and concurrent create_tables on the engines that do not run here (SQL Server, Oracle): the
SQL each backend sends, compiled by SQLAlchemy's real dialects, and its classification of the real driver errors."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError

from idem_dialects.claims import CONFLICT_RETRY_AFTER, Claims
from idem_dialects.core import Core
from idem_dialects.outcomes import InFlight

pytest.importorskip("oracledb", reason="the [oracle] extra (python-oracledb) is not installed")
from mssql_common import FREETDS, ODBC18, FakeConnection, load_pyodbc, pyodbc_error
from mssql_common import URL as MSSQL_URL
from offline_common import run
from ora_common import CLOSED_PORT_URL, ORA_00054, ScriptedConnection, ora_error, wrapped
from ora_common import Result as OraResult

# --- Oracle: a user lock taken without waiting before the claim --------------------------------------------------


@pytest.fixture(scope="module")
def ora_core() -> Claims:
    return Claims(Core(create_engine(CLOSED_PORT_URL), "idem_", None, None))


def test_oracle_conflict_claim_takes_a_user_lock_without_waiting_first(ora_core: Claims) -> None:
    req = ora_core.request("s", "op", "k", {"a": 1}, None)
    busy = wrapped(ora_error(54, ORA_00054), ora_core.core.engine, "DECLARE busy EXCEPTION; ...")
    conn = ScriptedConnection(ora_core.core.engine, [busy])
    outcome = run(ora_core.claim(req, wait=False), conn)
    assert isinstance(outcome, InFlight) and outcome.retry_after == CONFLICT_RETRY_AFTER
    [(text, params)] = conn.statements  # the claim's INSERT never ran: nothing waited
    assert "DBMS_LOCK.REQUEST(id => lock_id, lockmode => DBMS_LOCK.X_MODE, timeout => 0," in text
    assert "release_on_commit => TRUE" in text  # released by the transaction's end, whatever it is
    assert "SELECT ORA_HASH(:idem_lock_name, 1073741823) INTO lock_id FROM dual" in text
    assert "PRAGMA EXCEPTION_INIT(busy, -54)" in text and "IF result = 1 THEN RAISE busy;" in text
    assert params == {"idem_lock_name": "idem_records\x00s\x00op\x00k"}


def test_oracle_conflict_claim_granted_goes_on_to_the_plain_claim(ora_core: Claims) -> None:
    req = ora_core.request("s", "op", "k", {"a": 1}, None)
    conn = ScriptedConnection(ora_core.core.engine, [OraResult(), OraResult(rowcount=1)])
    outcome = run(ora_core.claim(req, wait=False), conn)
    assert type(outcome).__name__ == "Claimed"
    assert "DBMS_LOCK.REQUEST" in conn.statements[0][0]
    assert conn.statements[1][0].startswith("INSERT INTO idem_records")


def test_oracle_classifies_busy_and_already_created_by_number(ora_core: Claims) -> None:
    backend, engine = ora_core.core.backend, ora_core.core.engine
    assert backend.errors.is_lock_busy(wrapped(ora_error(54, ORA_00054), engine))
    assert not backend.errors.is_lock_busy(wrapped(ora_error(60, "ORA-00060: deadlock detected"), engine))
    exists = wrapped(ora_error(955, "ORA-00955: name is already used by an existing object"), engine,
                     "CREATE TABLE idem_records ...")
    assert backend.errors.is_already_created(exists) and not backend.errors.is_lock_busy(exists)


# --- SQL Server: SET LOCK_TIMEOUT 0 around the claim, the session's value put back --------------------------------


@pytest.fixture(scope="module")
def mssql_backend() -> Any:
    load_pyodbc()
    from idem_dialects.dialects.mssql import MSSQLBackend

    return MSSQLBackend(create_engine(MSSQL_URL))


@pytest.mark.parametrize("fails", [False, True], ids=["claimed", "lock-timeout"])
def test_mssql_conflict_claim_runs_under_lock_timeout_zero_and_restores_it(mssql_backend: Any, fails: bool) -> None:
    dialect = mssql_backend.engine.dialect
    conn = FakeConnection((7000,), None, None)  # @@LOCK_TIMEOUT, SET LOCK_TIMEOUT 0, the restore
    error = pyodbc_error(ODBC18, None, 1222)

    def claim() -> Any:  # a claim flow that runs no statement here: it is claimed, or meets the lock timeout
        if fails:
            raise error
        return "claimed"
        yield

    with pytest.raises(DBAPIError) if fails else nullcontext():
        run(mssql_backend.not_waiting(None, {}, claim()), conn)
    texts = [" ".join(str(s.compile(dialect=dialect)).split()) for s in conn.statements]
    assert texts == ["SELECT @@LOCK_TIMEOUT", "SET LOCK_TIMEOUT 0", "SET LOCK_TIMEOUT 7000"]


@pytest.mark.parametrize("driver", [ODBC18, FREETDS], ids=["odbc18", "freetds"])
def test_mssql_classifies_lock_timeout_and_already_created_by_number(mssql_backend: Any, driver: str) -> None:
    assert mssql_backend.errors.is_lock_busy(pyodbc_error(driver, None, 1222))
    assert not mssql_backend.errors.is_lock_busy(pyodbc_error(driver, None, 1205))  # a deadlock is retried, not busy
    exists = pyodbc_error(driver, "42S01", 2714, "There is already an object named 'idem_records' in the database.")
    assert mssql_backend.errors.is_already_created(exists) and not mssql_backend.errors.is_duplicate(exists)
    assert not mssql_backend.errors.is_already_created(pyodbc_error(driver, None, 2627))
