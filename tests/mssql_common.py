"""SQL Server test helpers shared by tests/test_mssql*.py: the real mssql dialect and backend without a server,
compiled SQL, and fake connections that script what the driver returns."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.dialects.mssql import pyodbc as mssql_pyodbc
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError

from idem_dialects.dialects.mssql import (
    MSSQLBackend,
)
from idem_dialects.schema import Tables, build_tables

URL = "mssql+pyodbc://sa:x@127.0.0.1:1/db?driver=FreeTDS"  # port 1: nothing listens there
ODBC18_URL = "mssql+pyodbc://sa:x@127.0.0.1:1/db?driver=ODBC+Driver+18+for+SQL+Server&TrustServerCertificate=yes"


@pytest.fixture(scope="module")
def dialect() -> Dialect:
    return mssql_pyodbc.dialect(paramstyle="qmark")  # what create_engine picks for pyodbc


@pytest.fixture(scope="module")
def backend() -> MSSQLBackend:
    pytest.importorskip("pyodbc", reason="pyodbc needs unixODBC (apt-get install unixodbc tdsodbc)")
    from sqlalchemy import create_engine

    return MSSQLBackend(create_engine(URL))


@pytest.fixture(scope="module")
def tables(backend: MSSQLBackend) -> Tables:
    return build_tables("idem_", backend)


def sql(stmt: Any, dialect: Dialect) -> str:
    return " ".join(str(stmt.compile(dialect=dialect)).split())


class FakeResult:
    def __init__(self, value: Any) -> None:
        self.value = value
        self.rowcount = value if isinstance(value, int) else -1

    def scalar_one(self) -> Any:
        return self.value

    def scalar(self) -> Any:
        return self.value

    def first(self) -> Any:
        return self.value


class FakeConnection:
    """Records what the backend executes and answers from a script (no database needed)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.statements: list[Any] = []

    def execute(self, stmt: Any, *args: Any) -> FakeResult:
        self.statements.append(stmt)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return FakeResult(answer)


# Message formats. pyodbc (src/errors.cpp, GetErrorFromHandle) builds args = (sqlstate, message) with message
# "[<sqlstate>] <driver text> (<native error>) (<ODBC function>)"; on non-Windows it reads only the first diagnostic
# record, on Windows it appends "; [<sqlstate>] <text> (<native>)" per further record.
# Driver text: Microsoft ODBC Driver 18 prefixes "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]";
# FreeTDS (src/odbc/error.c, msgprefix) prefixes "[FreeTDS][SQL Server]".
# SQLSTATEs: ODBC Driver 18 reports 23000 for 2627/2601/515/547, 40001 for 1205, HY000 for 1222. FreeTDS maps
# server numbers itself (src/tds/mem.c, tds_alloc_lookup_sqlstate): 2627 and 547 -> 23000; numbers it does not
# list (2601, 515, 1205, 1222) fall back to 42000 for severity > 10 (src/odbc/odbc.c), so pyodbc raises
# ProgrammingError for a FreeTDS 2601: classification must not depend on the exception class or SQLSTATE.
# Server texts are SQL Server's sys.messages entries for each number.
ODBC18 = "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]"
FREETDS = "[FreeTDS][SQL Server]"
TEXTS = {
    2627: "Violation of PRIMARY KEY constraint 'idem_records_pk'. Cannot insert duplicate key in object "
          "'dbo.idem_records'. The duplicate key value is (0x733a31, 0x6f70, 0x6b).",
    2601: "Cannot insert duplicate key row in object 'dbo.idem_fx' with unique index 'ix_idem_fx_ref'. "
          "The duplicate key value is (ref-1).",
    515: "Cannot insert the value NULL into column 'fingerprint', table 'test.dbo.idem_records'; column does not "
         "allow nulls. INSERT fails.",
    547: "The INSERT statement conflicted with the FOREIGN KEY constraint \"fk_child_parent\". The conflict "
         "occurred in database \"test\", table \"dbo.parent\", column 'id'.",
    1205: "Transaction (Process ID 57) was deadlocked on lock resources with another process and has been chosen "
          "as the deadlock victim. Rerun the transaction.",
    1222: "Lock request time out period exceeded.",
    3960: "Snapshot isolation transaction aborted due to update conflict. You cannot use snapshot isolation to "
          "access table 'dbo.idem_records' directly or indirectly in database 'test' to update, delete, or insert "
          "the row that has been modified or deleted by another transaction. Retry the transaction or change the "
          "isolation level for the update/delete statement.",
}
SQLSTATES = {
    ODBC18: {2627: "23000", 2601: "23000", 515: "23000", 547: "23000", 1205: "40001", 1222: "HY000", 3960: "HY000"},
    FREETDS: {2627: "23000", 2601: "42000", 515: "42000", 547: "23000", 1205: "42000", 1222: "42000", 3960: "42000"},
}


def pyodbc_error(driver: str, sqlstate: str | None, number: int, text: str | None = None,
                 function: str = "SQLExecDirectW", more: str = "") -> DBAPIError:
    """A real pyodbc exception as pyodbc raises it, wrapped the way SQLAlchemy wraps it."""
    pyodbc = pytest.importorskip("pyodbc")
    state = sqlstate or SQLSTATES[driver][number]
    message = f"[{state}] {driver}{text if text is not None else TEXTS[number]} ({number}) ({function}){more}"
    cls = {"23": pyodbc.IntegrityError, "42": pyodbc.ProgrammingError}.get(state[:2], pyodbc.Error)
    orig = cls(state, message)
    assert orig.args == (state, message)
    return DBAPIError.instance("INSERT INTO idem_records ...", [], orig, pyodbc.Error)
