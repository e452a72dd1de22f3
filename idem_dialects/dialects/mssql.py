"""SQL Server 2022/2025 through pyodbc (Microsoft ODBC Driver 18 or FreeTDS, chosen by the URL's ``driver=``).

Four things SQL Server does differently from the portable defaults, and what this module does about each:

- **A duplicate can doom the transaction.** With ``SET XACT_ABORT ON`` any error, a primary-key violation included,
  rolls back or dooms the caller's transaction, so the portable savepoint-and-catch is not enough. The claim runs as
  one batch that turns XACT_ABORT off around the INSERT, catches 2627/2601 by number in TRY/CATCH, restores the
  session's settings and re-THROWs everything else with its own number (see `_CLAIM_BATCH`).
- **(n)varchar equality ignores trailing spaces and follows the collation.** Identity columns are VARBINARY holding
  UTF-8, which has no collation and never pads or folds; the primary key is NONCLUSTERED so 255-character keys fit
  the index key limit (see `KEY_BYTES`).
- **A SNAPSHOT transaction cannot see a winner that committed after it began.** The duplicate error proves the row
  exists, so `read_row` raises the retryable `WinnerNotVisible` instead of reporting it absent; `run` retries in a
  fresh transaction, which sees it. SNAPSHOT is a supported level only where the database allows it
  (``ALLOW_SNAPSHOT_ISOLATION ON``): the live server decides (`refine_features`).
- **Error codes are in the message.** pyodbc gives ``(sqlstate, message)`` only; the native number is the
  ``(NNNN)`` pyodbc itself appends after the driver's text, parsed anchored to that structure (`native_error`).

`run(..., on_in_flight="conflict")` claims under ``SET LOCK_TIMEOUT 0``: a duplicate's INSERT that would wait on the
first claimer's uncommitted key fails with 1222, answered in flight; the session's @@LOCK_TIMEOUT is put back after.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String, case, delete, func, literal, literal_column, select, text, type_coerce
from sqlalchemy import column as sql_column
from sqlalchemy import table as sql_table
from sqlalchemy.dialects.mssql import DATETIME2, VARBINARY
from sqlalchemy.engine import Connection, ExceptionContext
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement, ColumnElement
from sqlalchemy.sql.expression import Executable
from sqlalchemy.sql.schema import Table
from sqlalchemy.types import TypeEngine

from ..errors import (
    CannotConnect,
    ConnectionConfigError,
    IdemError,
    InvalidKey,
    MissingDriver,
    RetryCause,
    WinnerNotVisible,
)
from ..features import Features
from ..guard import MISSING_TABLE, NO_PRIVILEGE
from .base import AnyRow, Backend
from .drivers import LIBLTDL, UNIXODBC, Driver
from .types import Utf8Bytes

# Native SQL Server error numbers.
ER_DUP_CONSTRAINT = 2627  # Violation of PRIMARY KEY / UNIQUE constraint
ER_DUP_INDEX = 2601  # Cannot insert duplicate key row ... with unique index
ER_NOT_NULL = 515  # Cannot insert the value NULL into column
ER_CONSTRAINT_CONFLICT = 547  # FOREIGN KEY / CHECK constraint conflict
ER_DEADLOCK = 1205  # chosen as deadlock victim; the transaction is already rolled back
ER_LOCK_TIMEOUT = 1222  # Lock request time out period exceeded (SET LOCK_TIMEOUT)
ER_SNAPSHOT_CONFLICT = 3960  # Snapshot isolation transaction aborted due to update conflict
ER_OBJECT_EXISTS = 2714  # There is already an object named ... in the database (a concurrent CREATE TABLE)
ER_INDEX_EXISTS = 1913  # The operation failed because an index or statistics with name ... already exists
ER_INVALID_OBJECT = 208  # Invalid object name (the table does not exist)
ER_PERMISSION_OBJECT = 229  # The <verb> permission was denied on the object
ER_PERMISSION_DATABASE = 262  # CREATE TABLE permission denied in database
# The claim's lock wait, refused (on_in_flight="conflict"); SET LOCK_TIMEOUT takes a literal, so the session's value
# is read first and written back as an int.
_LOCK_TIMEOUT_NOW = text("SELECT @@LOCK_TIMEOUT")
_NOWAIT_ON = text("SET LOCK_TIMEOUT 0")
DUPLICATE_ERRORS = frozenset({ER_DUP_CONSTRAINT, ER_DUP_INDEX})
_RETRYABLE = {ER_DEADLOCK: RetryCause.DEADLOCK, ER_LOCK_TIMEOUT: RetryCause.LOCK_TIMEOUT,
              ER_SNAPSHOT_CONFLICT: RetryCause.SERIALIZATION}

# @@OPTIONS bits, and sys.dm_exec_sessions.transaction_isolation_level for SNAPSHOT.
_OPT_NOCOUNT = 512
_OPT_XACT_ABORT = 16384
_ISOLATION_SNAPSHOT = 5

# Identity columns hold UTF-8 whole: 255 characters are at most 1020 bytes. No lossless encoding of three such
# fields fits the 900-byte limit of a clustered key (255 arbitrary code points carry about 640 bytes of information
# each), so the primary key is NONCLUSTERED, whose limit is 1700 bytes (SQL Server 2016+): any identity whose fields
# together are at most 1700 bytes of UTF-8 fits - e.g. all three 255 ASCII characters (765), or one field of 255
# 4-byte characters (1020) with short others. A longer identity is refused with InvalidKey before the INSERT (SQL
# Server would fail it with error 1946). Valid keys contain no NUL, so their UTF-8 has no 0x00 byte for binary
# padding to ignore.
KEY_BYTES = 255 * 4
INDEX_KEY_LIMIT = 1700
_BIN2 = "Latin1_General_100_BIN2"
_MAX_OFFSET_MICROS = 700_000 * 86_400_000_000  # ~1900 years: inside DATETIME2's range from any present-day clock


def _datetime2() -> TypeEngine[datetime]:
    """DATETIME2 (100 ns, no time zone): what SYSUTCDATETIME() returns, so stored and compared times agree."""
    return DATETIME2()  # type: ignore[no-untyped-call]


# pyodbc's message: "[SQLSTATE] <driver text> (<native>) (<ODBC function>)", further diagnostic records (Windows only)
# appended as "; [SQLSTATE] <text> (<native>)". The function name is added only after the first record, by pyodbc,
# after all of the server's text, so its last occurrence marks the end of the first record.
_FIRST_RECORD_END = re.compile(r" \((-?\d+)\) \((SQL[A-Za-z]+)\)(?=; \[|\Z)")
_PYODBC_PREFIX = re.compile(r"\A\[[0-9A-Z]{5}\] ")


# Why a batch and not a savepoint: with XACT_ABORT ON a 2627 dooms the transaction even inside a savepoint or
# TRY/CATCH; with it OFF (here, for this one INSERT) a duplicate only ends the statement. Why not
# INSERT ... WHERE NOT EXISTS (... UPDLOCK, HOLDLOCK): its key-range locks make claims of *different* keys that fall
# in the same gap wait for each other for the whole effect. The plain INSERT waits only on the same key's lock held
# by the winner: once the winner commits it fails with 2627 (caught here), if the winner rolls back it succeeds.
# Settings are restored before anything leaves the batch (and SQL Server also restores SET options when a
# parameterized batch, run through sp_executesql, ends). A duplicate is swallowed only while the transaction is
# still committable; everything else is re-thrown unchanged (THROW keeps the number), honouring XACT_ABORT again.
_CLAIM_BATCH = """\
DECLARE @idem_options int = @@OPTIONS, @idem_inserted int = 1;
SET NOCOUNT ON;
SET XACT_ABORT OFF;
BEGIN TRY
    {insert};
END TRY
BEGIN CATCH
    IF @idem_options & {xact_abort} <> 0 SET XACT_ABORT ON;
    IF @idem_options & {nocount} = 0 SET NOCOUNT OFF;
    IF ERROR_NUMBER() IN ({dup_constraint}, {dup_index}) AND XACT_STATE() <> -1
        SET @idem_inserted = 0;
    ELSE
        THROW;
END CATCH;
IF @idem_options & {xact_abort} <> 0 SET XACT_ABORT ON;
IF @idem_options & {nocount} = 0 SET NOCOUNT OFF;
SELECT @idem_inserted AS inserted;"""


# The connect_args with which these drivers open their connections in autocommit mode (refused by the store).
_AUTOCOMMIT = {"autocommit": True}


class InsertIfAbsent(Executable, ClauseElement):
    """The claim batch around one INSERT; it returns one row, `inserted` (1 or 0)."""

    inherit_cache = False  # no cache key of its own: the batch is recompiled per execution (a cheap string format)

    def __init__(self, table: Table, values: Mapping[str, Any]) -> None:
        self.insert = table.insert().values(**values)


@compiles(InsertIfAbsent, "mssql")
def _compile_insert_if_absent(element: InsertIfAbsent, compiler: SQLCompiler, **kw: Any) -> str:
    # Compile the INSERT as a nested statement (as inside a CTE): the batch, not the INSERT, is what executes, so
    # SQLAlchemy must not treat the execution as an INSERT (which would discard the batch's result row). `stack` has
    # no public equivalent; tests/test_mssql.py::test_private_compiler_stack_still_exists fails loudly if it moves.
    compiler.stack.append({"correlate_froms": set(), "asfrom_froms": set(), "selectable": element.insert})
    try:
        insert = compiler.process(element.insert, **kw)
    finally:
        compiler.stack.pop()
    return _CLAIM_BATCH.format(
        insert=insert,
        xact_abort=_OPT_XACT_ABORT,
        nocount=_OPT_NOCOUNT,
        dup_constraint=ER_DUP_CONSTRAINT,
        dup_index=ER_DUP_INDEX,
    )


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


def _nonclustered_primary_key(table: Table, *_: Any, **__: Any) -> None:
    """before_create: the identity primary key is NONCLUSTERED (1700-byte key limit instead of 900)."""
    table.primary_key.dialect_options["mssql"]["clustered"] = False


def check_index_key(table: Table, values: Mapping[str, Any]) -> None:
    """Refuse, before any SQL, an identity longer than the primary key index can hold (SQL Server error 1946)."""
    fields = [(col.name, values.get(col.name)) for col in table.primary_key.columns]
    size = sum(len(v.encode("utf-8")) for _, v in fields if isinstance(v, str))
    if size > INDEX_KEY_LIMIT:
        name, value = max(fields, key=lambda f: len(f[1].encode("utf-8")) if isinstance(f[1], str) else 0)
        field = {"idem_key": "key"}.get(name, name)
        raise InvalidKey(field, f"makes the identity {size} bytes of UTF-8 together with the other fields; SQL Server"
                                f" indexes at most {INDEX_KEY_LIMIT}", value)


class MSSQLBackend(Backend):
    name = "mssql"
    aliases = ("sqlserver", "tsql")
    extra = "mssql"
    drivers = (
        Driver("pyodbc", "pyodbc", "idem-dialects[mssql]", libraries=(UNIXODBC,), autocommit_args=_AUTOCOMMIT),
        Driver("aioodbc", "aioodbc", "idem-dialects[mssql]", sync=False, asynchronous=True, libraries=(UNIXODBC,),
               autocommit_args=_AUTOCOMMIT),
        # Bundles Microsoft's ODBC Driver 18 (no system ODBC), which loads libltdl when the first connection opens.
        Driver("mssqlpython", "mssql_python", "idem-dialects[mssql]", libraries=(LIBLTDL,),
               autocommit_args=_AUTOCOMMIT),
        Driver("pymssql", "pymssql", "pymssql"),
    )
    provision = "idem_dialects.dialects.mssql_provision:MSSQLProvision"
    base_features = Features(isolation_levels=("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE", "SNAPSHOT"),
                             max_identity_bytes=INDEX_KEY_LIMIT)

    def refine_features(self, conn: Connection, features: Features) -> Features:
        features = super().refine_features(conn, features)
        allowed = conn.execute(
            text("SELECT snapshot_isolation_state FROM sys.databases WHERE name = DB_NAME()")).scalar()
        if allowed != 1:  # 1 = ON; SET TRANSACTION ISOLATION LEVEL SNAPSHOT would fail with error 3952
            features = features.replace(isolation_levels=tuple(lvl for lvl in features.isolation_levels
                                                               if lvl != "SNAPSHOT"))
        return features

    # --- column types ----------------------------------------------------------------------------------------

    def key_type(self) -> TypeEngine[str]:
        return Utf8Bytes(VARBINARY(KEY_BYTES))  # type: ignore[no-untyped-call]

    def token_type(self) -> TypeEngine[str]:
        return String(64, collation=_BIN2)  # ASCII hex, compared exactly

    def timestamp_type(self) -> TypeEngine[datetime]:
        return _datetime2()

    def blob_type(self) -> TypeEngine[bytes]:
        # Explicit: LargeBinary renders as IMAGE until the dialect has seen the server's version.
        return VARBINARY("max")  # type: ignore[no-untyped-call]

    def table_kwargs(self) -> dict[str, Any]:
        # No OUTPUT inserted.* for RETURNING: SQL Server rejects OUTPUT without INTO on a table with triggers.
        return {"implicit_returning": False, "listeners": [("before_create", _nonclustered_primary_key)]}

    # --- the clock -------------------------------------------------------------------------------------------

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        # DATEADD takes an int: split into days, seconds and microseconds so years and microseconds both fit.
        total = min(_MAX_OFFSET_MICROS, abs(round(seconds * 1_000_000)))
        sign = -1 if seconds < 0 else 1
        days, rest = divmod(total, 86_400_000_000)
        secs, micros = divmod(rest, 1_000_000)
        expr: ColumnElement[Any] = func.sysutcdatetime()
        for part, amount in (("microsecond", micros), ("second", secs), ("day", days)):
            if amount:
                expr = func.dateadd(literal_column(part), literal_column(str(sign * amount), Integer), expr)
        return type_coerce(expr, _datetime2())

    # --- the protocol's statements ---------------------------------------------------------------------------

    def insert_if_absent(
        self, conn: Connection, table: Table, values: Mapping[str, Any], clock: Mapping[str, float] | None = None
    ) -> bool:
        check_index_key(table, values)
        stmt = self.prepared_insert(table, values, clock, lambda v: InsertIfAbsent(table, v))
        return bool(conn.execute(stmt, self.params(values)).scalar_one())

    def read_row(self, conn: Connection, table: Table, key: Mapping[str, str]) -> AnyRow | None:
        row = super().read_row(conn, table, key)
        if row is None and self._in_snapshot(conn):
            # The insert just failed on this key, so the row exists: our snapshot predates its commit.
            raise WinnerNotVisible(table.name)
        return row

    @staticmethod
    def _in_snapshot(conn: Connection) -> bool:
        level = conn.execute(
            text("SELECT transaction_isolation_level FROM sys.dm_exec_sessions WHERE session_id = @@SPID")
        ).scalar()
        return level == _ISOLATION_SNAPSHOT

    def purge_batch(self, conn: Connection, table: Table, condition: ColumnElement[bool], limit: int) -> int:
        # One statement, the batch size bounding the locks it takes; `limit` is a validated int.
        return conn.execute(delete(table).where(condition).prefix_with(f"TOP ({int(limit)})")).rowcount

    # --- operations ------------------------------------------------------------------------------------------

    @property
    def db_system_name(self) -> str:
        return "microsoft.sql_server"

    def size_statement(self, table: Table) -> Executable:
        # Pages in use (in-row, LOB and row-overflow) of the heap or clustered index (index_id 0/1) and of the other
        # indexes; needs VIEW DATABASE STATE (or the table's owner), else stats says the size is unavailable.
        stats = sql_table("dm_db_partition_stats", *map(sql_column, ("object_id", "index_id", "used_page_count")),
                          schema="sys")
        pages = stats.c.used_page_count

        def total(condition: ColumnElement[bool]) -> ColumnElement[Any]:
            return func.sum(case((condition, pages), else_=literal_column("0"))) * literal_column("8192")

        name = self.engine.dialect.identifier_preparer.format_table(table)
        return select(total(stats.c.index_id < literal_column("2")), total(stats.c.index_id >= literal_column("2"))
                      ).where(stats.c.object_id == func.object_id(literal(name)))

    # --- error classification --------------------------------------------------------------------------------

    def is_duplicate(self, exc: DBAPIError) -> bool:
        # Not by exception class or SQLSTATE: FreeTDS reports 2601 as 42000 (a ProgrammingError), not 23000.
        return native_error(exc) in DUPLICATE_ERRORS

    def is_already_created(self, exc: DBAPIError) -> bool:
        return native_error(exc) in (ER_OBJECT_EXISTS, ER_INDEX_EXISTS)

    @contextmanager
    def not_waiting(self, conn: Connection, table: Table, key: Mapping[str, str]) -> Iterator[None]:
        previous = int(conn.execute(_LOCK_TIMEOUT_NOW).scalar_one())
        conn.execute(_NOWAIT_ON)
        try:
            yield
        finally:
            conn.execute(text(f"SET LOCK_TIMEOUT {previous}"))  # session state; an int read just now

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        return native_error(exc) == ER_LOCK_TIMEOUT


    def config_problem(self, exc: DBAPIError, context: ExceptionContext, tables: Sequence[str]) -> str | None:
        number = native_error(exc)
        if number == ER_INVALID_OBJECT or mssql_python_sqlstate(exc) == "42S02":
            return MISSING_TABLE
        return NO_PRIVILEGE if number in (ER_PERMISSION_OBJECT, ER_PERMISSION_DATABASE) else None

    def connect_error(self, exc: BaseException) -> IdemError | None:
        state = odbc_sqlstate(exc)
        if state in ("IM002", "01000"):  # driver manager: no such driver/DSN; the driver's library cannot load
            return missing_driver(self.name, self.engine.url.query.get("driver"), self.engine.url.host)
        if state == "28000":
            return ConnectionConfigError(self.name, "login failed (SQLSTATE 28000)", "check the user and password")
        if state in _CONNECT_TRANSIENT or self.retry_cause(exc) is not None:
            return CannotConnect(self.name, exc)
        # No SQLSTATE: mssql-python's bundled ODBC driver loads its system libraries only as a connection opens.
        driver = self.driver(self.engine.dialect.driver)
        missing = driver.missing_libraries() if driver is not None else []
        if driver is not None and missing:  # the same answer as for pyodbc, whose import fails without unixODBC
            return MissingDriver(f"{self.name}+{driver.name}", self.install_hint(driver.name), exc, missing[0].soname)
        return super().connect_error(exc)

    def migration_table(self, table: Table) -> None:
        _nonclustered_primary_key(table)  # what the before_create listener of `table_kwargs` does at create time

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        if isinstance(exc, DBAPIError):
            number = native_error(exc)
            if number is not None and number in _RETRYABLE:
                return _RETRYABLE[number]
            state = mssql_python_sqlstate(exc)
            if state in _MSSQL_PYTHON_RETRYABLE:
                return _MSSQL_PYTHON_RETRYABLE[state]
        return super().retry_cause(exc)
