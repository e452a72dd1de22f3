"""SQL Server's errors: the native error number pyodbc appends to its message (parsed anchored to that
structure, never searched for), and the SQLSTATE mssql-python's errors stand for."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import DBAPIError

from ..errors import CannotConnect, ConnectionConfigError, IdemError, MissingDriver, RetryCause
from . import install_hint
from .classify import MISSING_TABLE, NO_PRIVILEGE, ErrorClassifier, credentials_fix

# Native SQL Server error numbers.
ER_DUP_CONSTRAINT = 2627  # Violation of PRIMARY KEY / UNIQUE constraint
ER_DUP_INDEX = 2601  # Cannot insert duplicate key row ... with unique index
# Not duplicates, whatever their SQLSTATE: 515 (NULL into a NOT NULL column), 547 (FOREIGN KEY / CHECK conflict).
ER_DEADLOCK = 1205  # chosen as deadlock victim; the transaction is already rolled back
ER_LOCK_TIMEOUT = 1222  # Lock request time out period exceeded (SET LOCK_TIMEOUT)
ER_SNAPSHOT_CONFLICT = 3960  # Snapshot isolation transaction aborted due to update conflict
ER_OBJECT_EXISTS = 2714  # There is already an object named ... in the database (a concurrent CREATE TABLE)
ER_INDEX_EXISTS = 1913  # The operation failed because an index or statistics with name ... already exists
ER_INVALID_OBJECT = 208  # Invalid object name (the table does not exist)
ER_PERMISSION_OBJECT = 229  # The <verb> permission was denied on the object
ER_PERMISSION_DATABASE = 262  # CREATE TABLE permission denied in database
DUPLICATE_ERRORS = frozenset({ER_DUP_CONSTRAINT, ER_DUP_INDEX})
_RETRYABLE = {ER_DEADLOCK: RetryCause.DEADLOCK, ER_LOCK_TIMEOUT: RetryCause.LOCK_TIMEOUT,
              ER_SNAPSHOT_CONFLICT: RetryCause.SERIALIZATION}

# pyodbc's message: "[SQLSTATE] <driver text> (<native>) (<ODBC function>)", further diagnostic records (Windows only)
# appended as "; [SQLSTATE] <text> (<native>)". The function name is added only after the first record, by pyodbc,
# after all of the server's text, so its last occurrence marks the end of the first record.
_FIRST_RECORD_END = re.compile(r" \((-?\d+)\) \((SQL[A-Za-z]+)\)(?=; \[|\Z)")
_PYODBC_PREFIX = re.compile(r"\A\[[0-9A-Z]{5}\] ")


# ODBC SQLSTATEs of a connection that could not be made now but may be in a moment.
_CONNECT_TRANSIENT = frozenset({"08001", "08S01", "HYT00", "HYT01"})


def odbc_sqlstate(exc: BaseException) -> str | None:
    """The ODBC SQLSTATE pyodbc puts first in its error's args (e.g. IM002: driver manager found no driver)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    args: tuple[Any, ...] = getattr(orig, "args", ())
    if len(args) >= 2 and isinstance(args[0], str) and len(args[0]) == 5:
        return args[0]
    return mssql_python_sqlstate(exc)  # mssql-python: the SQLSTATE its error's description stands for


def missing_driver(backend: str, named: object, host: object) -> ConnectionConfigError:
    """The ODBC driver the URL names is not installed (or, without driver=, its host is no known DSN)."""
    try:
        import pyodbc

        installed = ", ".join(pyodbc.drivers()) or "none"
    except ImportError:
        installed = "unknown (pyodbc is not importable)"
    if named is None:
        return ConnectionConfigError(backend, f"the URL names no ODBC driver and {host!r} is no configured DSN",
                                     f"add ?driver=<name> to the URL (installed drivers: {installed})")
    return ConnectionConfigError(
        backend, f"the ODBC driver {named!r} named in the URL is not installed (installed: {installed})",
        "install it (Microsoft's msodbcsql18, or apt-get install tdsodbc for FreeTDS) or set ?driver= to an"
        " installed one")


def native_error(exc: BaseException) -> int | None:
    """SQL Server's native error number for a pyodbc error (or a SQLAlchemy error wrapping one), else None.

    Read from the end of pyodbc's first diagnostic record, never searched for anywhere in the text: a key value,
    constraint or column name quoted in the server's message cannot pose as the number.
    """
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if orig is None or not type(orig).__module__.startswith("pyodbc"):
        return None
    for arg in reversed(getattr(orig, "args", ())):  # (sqlstate, message); pyodbc's own errors are (message, state)
        if isinstance(arg, str) and _PYODBC_PREFIX.match(arg):
            ends = list(_FIRST_RECORD_END.finditer(arg))
            if ends:
                return int(ends[-1].group(1))
    return None


# Microsoft's mssql-python driver (``mssql+mssqlpython://``, SQLAlchemy 2.1) raises exceptions that carry neither the
# native error number nor the SQLSTATE: only `driver_error`, a fixed description per SQLSTATE from the driver's own
# table (mssql_python.exceptions.sqlstate_to_exception), and the server's text. This module maps the description
# back to its SQLSTATE and classifies by that; what a SQLSTATE cannot tell apart (a duplicate from a NOT NULL
# violation: both 23000) is not classified. Claims do not depend on it: their batch catches 2627/2601 by
# ERROR_NUMBER() inside SQL Server.
_MSSQL_PYTHON_RETRYABLE = {"40001": RetryCause.DEADLOCK,  # SQL Server's deadlock victim (1205) is 40001
                           "08S01": RetryCause.CONNECTION, "08003": RetryCause.CONNECTION}
_mssql_python_states: dict[str, str] = {}


def mssql_python_sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of an mssql-python error (wrapped by SQLAlchemy or not), else None."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if orig is None or not type(orig).__module__.startswith("mssql_python"):
        return None
    if not _mssql_python_states:
        from mssql_python.exceptions import sqlstate_to_exception  # loaded: it raised `orig`

        for state in ("08001", "08003", "08S01", "23000", "28000", "40001", "42000", "42S02", "HYT00"):
            known = sqlstate_to_exception(state, "")
            if known is not None:
                _mssql_python_states.setdefault(known.driver_error, state)
    return _mssql_python_states.get(getattr(orig, "driver_error", None) or "")


class MSSQLErrors(ErrorClassifier):
    def is_duplicate(self, exc: DBAPIError) -> bool:
        # Not by exception class or SQLSTATE: FreeTDS reports 2601 as 42000 (a ProgrammingError), not 23000.
        return native_error(exc) in DUPLICATE_ERRORS

    def is_already_created(self, exc: DBAPIError) -> bool:
        return native_error(exc) in (ER_OBJECT_EXISTS, ER_INDEX_EXISTS)

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        return native_error(exc) == ER_LOCK_TIMEOUT

    def config_problem(self, exc: DBAPIError, tables: Sequence[str], dbapi_connection: Any) -> str | None:
        number = native_error(exc)
        if number == ER_INVALID_OBJECT or mssql_python_sqlstate(exc) == "42S02":
            return MISSING_TABLE
        return NO_PRIVILEGE if number in (ER_PERMISSION_OBJECT, ER_PERMISSION_DATABASE) else None

    def connect_error(self, exc: BaseException) -> IdemError | None:
        name, url = self.backend.name, self.backend.engine.url
        state = odbc_sqlstate(exc)
        if state in ("IM002", "01000"):  # driver manager: no such driver/DSN; the driver's library cannot load
            return missing_driver(name, url.query.get("driver"), url.host)
        if state == "28000":
            return ConnectionConfigError(name, "login failed (SQLSTATE 28000)",
                                         credentials_fix("check the user and password", url))
        if state in _CONNECT_TRANSIENT or self.retry_cause(exc) is not None:
            return CannotConnect(name, exc)
        # No SQLSTATE: mssql-python's bundled ODBC driver loads its system libraries only as a connection opens.
        driver = next((d for d in self.backend.drivers if d.name == self.backend.engine.dialect.driver), None)
        missing = driver.missing_libraries() if driver is not None else []
        if driver is not None and missing:  # the same answer as for pyodbc, whose import fails without unixODBC
            return MissingDriver(f"{name}+{driver.name}", install_hint(name, driver.name), exc, missing[0].soname)
        return super().connect_error(exc)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        if isinstance(exc, DBAPIError):
            number = native_error(exc)
            if number is not None and number in _RETRYABLE:
                return _RETRYABLE[number]
            state = mssql_python_sqlstate(exc)
            if state in _MSSQL_PYTHON_RETRYABLE:
                return _MSSQL_PYTHON_RETRYABLE[state]
        return super().retry_cause(exc)
