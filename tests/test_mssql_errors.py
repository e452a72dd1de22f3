"""SQL Server without a server, continued: error classification on the exception objects pyodbc itself raises
(2627/2601 by native number, retryable errors), and building a store from a URL without connecting or importing
the driver early.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from mssql_common import *  # noqa: F403  (fixtures: backend, dialect, tables)
from mssql_common import FREETDS, ODBC18, ODBC18_URL, TEXTS, URL, load_pyodbc, pyodbc_error, sql
from sqlalchemy import event, select
from sqlalchemy.exc import DBAPIError, ProgrammingError

from idem_dialects import IdempotencyStore, InvalidKey
from idem_dialects.dialects import load
from idem_dialects.dialects.mssql import MSSQLBackend
from idem_dialects.dialects.mssql_errors import native_error
from idem_dialects.errors import RetryCause

# --- error classification on real pyodbc exceptions ---------------------------------------------------------------

DRIVERS = pytest.mark.parametrize("driver", [ODBC18, FREETDS], ids=["odbc18", "freetds"])


@DRIVERS
@pytest.mark.parametrize("number", [2627, 2601])
def test_duplicates_recognised_by_number(backend: MSSQLBackend, driver: str, number: int) -> None:
    """2627 (PK/unique constraint) and 2601 (unique index) are duplicates, from either driver, whatever class."""
    exc = pyodbc_error(driver, None, number)
    assert native_error(exc) == number
    assert backend.errors.is_duplicate(exc) and backend.errors.retry_cause(exc) is None


def test_freetds_2601_arrives_as_programming_error(backend: MSSQLBackend) -> None:
    exc = pyodbc_error(FREETDS, None, 2601)
    assert isinstance(exc, ProgrammingError) and backend.errors.is_duplicate(exc)


@DRIVERS
@pytest.mark.parametrize("number", [515, 547])
def test_other_integrity_errors_are_not_duplicates(backend: MSSQLBackend, driver: str, number: int) -> None:
    exc = pyodbc_error(driver, None, number)
    assert native_error(exc) == number
    assert not backend.errors.is_duplicate(exc) and backend.errors.retry_cause(exc) is None


@DRIVERS
@pytest.mark.parametrize(("number", "cause"), [(1205, RetryCause.DEADLOCK), (1222, RetryCause.LOCK_TIMEOUT),
                                               (3960, RetryCause.SERIALIZATION)])
def test_retryable_errors(backend: MSSQLBackend, driver: str, number: int, cause: str) -> None:
    """Deadlock victim, lock timeout and snapshot update conflict are retried by `run`; they are not duplicates."""
    exc = pyodbc_error(driver, None, number)
    assert backend.errors.retry_cause(exc) == cause and not backend.errors.is_duplicate(exc)


ADVERSARIAL = [
    # A constraint name (quoted identifiers may hold anything) that mimics a duplicate's ending, inside a 547.
    (547, TEXTS[547].replace("fk_child_parent", "fk (2601) (SQLExecDirectW); [23000] x (2627)")),
    # A column name holding "(2601)" inside a NOT NULL violation.
    (515, TEXTS[515].replace("'fingerprint'", "'ref (2601)'")),
    # A CHECK conflict (also 547) whose text ends with a number-like parenthesis before pyodbc's own.
    (547, "The INSERT statement conflicted with the CHECK constraint \"ck (2627)\". The conflict occurred in "
          "database \"test\", table \"dbo.t\", column 'k (2601)'."),
    # A duplicate whose key value says "(1205)": still a duplicate, not a deadlock.
    (2627, TEXTS[2627].replace("0x6b", "k (1205) (SQLExecDirectW)")),
]


@DRIVERS
@pytest.mark.parametrize(("number", "text"), ADVERSARIAL, ids=["547-fk-name", "515-column", "547-check", "2627-value"])
def test_number_is_read_from_the_end_not_from_the_text(backend: MSSQLBackend, driver: str, number: int,
                                                       text: str) -> None:
    exc = pyodbc_error(driver, None, number, text)
    assert native_error(exc) == number
    assert backend.errors.is_duplicate(exc) is (number == 2627)
    assert backend.errors.retry_cause(exc) is None


def test_windows_multi_record_messages(backend: MSSQLBackend) -> None:
    """pyodbc on Windows appends further records ("; [01000] ... The statement has been terminated. (3621)"):
    the number is the first record's, which ends with pyodbc's function name."""
    more = f"; [01000] {ODBC18}The statement has been terminated. (3621)"
    assert native_error(pyodbc_error(ODBC18, None, 2627, more=more)) == 2627
    adversarial = TEXTS[547].replace("fk_child_parent", "x (2627) (SQLExecDirectW); [01000] y")
    exc = pyodbc_error(ODBC18, None, 547, adversarial, more=more)
    assert native_error(exc) == 547 and not backend.errors.is_duplicate(exc)


@pytest.mark.parametrize("function", ["SQLExecDirectW", "SQLExecute", "SQLFetch", "SQLMoreResults", "SQLEndTran"])
def test_any_odbc_function_name(backend: MSSQLBackend, function: str) -> None:
    assert backend.errors.retry_cause(pyodbc_error(FREETDS, None, 1205, function=function)) == RetryCause.DEADLOCK


def test_unparseable_or_foreign_errors_are_not_classified(backend: MSSQLBackend) -> None:
    """No number, pyodbc's own (message, sqlstate) errors, and other drivers' exceptions classify as nothing."""
    pyodbc = load_pyodbc()
    for orig in [pyodbc.Error("HY000", "The driver did not supply an error!"),
                 pyodbc.ProgrammingError("Attempt to use a closed cursor.", "HY000"),
                 pyodbc.IntegrityError("23000", "Violation of PRIMARY KEY constraint (2627)"),  # no [state] / function
                 RuntimeError("[23000] [FreeTDS][SQL Server]Violation (2627) (SQLExecDirectW)")]:
        exc = DBAPIError.instance("x", [], orig, pyodbc.Error)
        assert native_error(exc) is None
        assert not backend.errors.is_duplicate(exc) and backend.errors.retry_cause(exc) is None


def test_lost_connection_is_retryable(backend: MSSQLBackend) -> None:
    pyodbc = load_pyodbc()
    orig = pyodbc.OperationalError("08S01", "[08S01] [FreeTDS][SQL Server]Communication link failure (0) "
                                            "(SQLExecDirectW)")
    exc = DBAPIError.instance("x", [], orig, pyodbc.Error, connection_invalidated=True)
    assert backend.errors.retry_cause(exc) == RetryCause.CONNECTION


# --- building from a URL: no connection, no early driver import --------------------------------------------------


@pytest.fixture
def offline_store() -> Iterator[tuple[IdempotencyStore, list[object]]]:
    load_pyodbc()
    store = IdempotencyStore.from_url(URL)
    connects: list[object] = []
    event.listen(store.engine, "connect", lambda *a: connects.append(a))
    yield store, connects
    store.engine.dispose()


class Untouchable:
    """A stand-in connection that fails the test if the store so much as looks at it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the connection was used ({name}) before validation")


@pytest.mark.parametrize("field", ["scope", "operation", "key"])
def test_invalid_key_before_any_connection(offline_store: tuple[IdempotencyStore, list[object]], field: str) -> None:
    """With nothing listening on the URL's port, run(...) and claim(...) still raise InvalidKey for an empty
    identity, and building the store never connected."""
    store, connects = offline_store
    assert type(store.backend) is MSSQLBackend
    args: dict[str, Any] = dict(scope="s", operation="op", key="k", request={"a": 1})
    args[field] = ""
    with pytest.raises(InvalidKey) as err:
        store.run(effect=lambda conn: None, **args)
    assert err.value.field == field
    with pytest.raises(InvalidKey):
        store.claim(Untouchable(), **args)  # type: ignore[arg-type]
    assert connects == [] and store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("url", [URL, ODBC18_URL], ids=["freetds", "odbc18"])
def test_backend_from_url(url: str) -> None:
    """The URL's dialect name picks MSSQLBackend; driver= (and other ODBC keywords) pass through to pyodbc."""
    load_pyodbc()
    store = IdempotencyStore.from_url(url, table_prefix="app_")
    try:
        assert load("mssql") is MSSQLBackend and type(store.backend) is MSSQLBackend
        assert store.engine.url.drivername == "mssql+pyodbc"
        cargs, _ = store.engine.dialect.create_connect_args(store.engine.url)
        assert ("DRIVER={FreeTDS}" if "FreeTDS" in url else "DRIVER={ODBC Driver 18 for SQL Server}") in cargs[0]
        assert store.tables.records.name == "app_records"
        assert sql(select(store.tables.records.c.idem_key), store.engine.dialect) == \
            "SELECT app_records.idem_key FROM app_records"
    finally:
        store.engine.dispose()


def test_importing_the_library_does_not_import_pyodbc() -> None:
    """Drivers load lazily: importing idem_dialects (and even its mssql backend module) leaves pyodbc unimported."""
    code = ("import sys, idem_dialects, idem_dialects.dialects.mssql\n"
            "assert 'pyodbc' not in sys.modules, 'pyodbc imported'\n"
            "from idem_dialects.dialects import load\n"
            "assert load('mssql').__name__ == 'MSSQLBackend' and 'pyodbc' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
