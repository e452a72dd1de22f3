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
  exists, so `read` raises the retryable `WinnerNotVisible` instead of reporting it absent; `run` retries in a
  fresh transaction, which sees it. SNAPSHOT is a supported level only where the database allows it
  (``ALLOW_SNAPSHOT_ISOLATION ON``): the live server decides (`refine_features`).
- **Error codes are in the message.** pyodbc gives ``(sqlstate, message)`` only; the native number is the
  ``(NNNN)`` pyodbc itself appends after the driver's text, parsed anchored to that structure (`native_error`).

`run(..., on_in_flight="conflict")` claims under ``SET LOCK_TIMEOUT 0``: a duplicate's INSERT that would wait on the
first claimer's uncommitted key fails with 1222, answered in flight; the session's @@LOCK_TIMEOUT is put back after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String, delete, func, literal_column, select, text, type_coerce
from sqlalchemy.dialects.mssql import DATETIME2, VARBINARY
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement, ColumnElement
from sqlalchemy.sql.expression import Executable
from sqlalchemy.sql.schema import Table
from sqlalchemy.types import TypeEngine

from ..drivers import aioodbc, mssqlpython, pymssql, pyodbc
from ..errors import InvalidKey, WinnerNotVisible
from ..features import Features
from ..steps import Flow, Shape, execute, rowcount
from .base import Backend, Columns, insert_values, params, set_during, statement
from .mssql_errors import ER_DUP_CONSTRAINT, ER_DUP_INDEX, MSSQLErrors
from .mssql_maintenance import MSSQLMaintenance
from .types import Utf8Bytes

# The claim's lock wait, refused (on_in_flight="conflict"); SET LOCK_TIMEOUT takes a literal, so the session's value
# is read first and written back as an int.
_LOCK_TIMEOUT_NOW = text("SELECT @@LOCK_TIMEOUT")
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
    drivers = (pyodbc.DRIVER, aioodbc.DRIVER, mssqlpython.DRIVER, pymssql.DRIVER)
    classifier = MSSQLErrors
    maintainer = MSSQLMaintenance
    aliases = ("sqlserver", "tsql")
    base_features = Features(isolation_levels=("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE", "SNAPSHOT"),
                             max_identity_bytes=INDEX_KEY_LIMIT)
    # Tokens are ASCII hex, compared exactly. VARBINARY(max) explicitly: LargeBinary renders as IMAGE until the
    # dialect has seen the server's version. No OUTPUT inserted.* for RETURNING: SQL Server rejects OUTPUT without
    # INTO on a table with triggers.
    columns = Columns(key=Utf8Bytes(VARBINARY(KEY_BYTES)), token=String(64, collation=_BIN2),  # type: ignore[no-untyped-call]
                      timestamp=_datetime2(), blob=VARBINARY("max"),  # type: ignore[no-untyped-call]
                      table_options={"implicit_returning": False,
                                     "listeners": [("before_create", _nonclustered_primary_key)]})

    def refine_features(self, features: Features) -> Flow[Features]:
        features = yield from super().refine_features(features)
        row = yield from execute(self.prepared("snapshot", lambda: statement(text(
            "SELECT snapshot_isolation_state FROM sys.databases WHERE name = DB_NAME()"), Shape.ROW)))
        if row is None or row[0] != 1:  # 1 = ON; SET TRANSACTION ISOLATION LEVEL SNAPSHOT would fail with error 3952
            features = features.replace(isolation_levels=tuple(lvl for lvl in features.isolation_levels
                                                               if lvl != "SNAPSHOT"))
        return features

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

    def insert_if_absent(self, table: Table, values: Mapping[str, Any],
                         clock: Mapping[str, float] | None = None) -> Flow[bool]:
        check_index_key(table, values)
        stmt = self.prepared(("insert", table, tuple(values), tuple(sorted((clock or {}).items()))), lambda: (
            statement(InsertIfAbsent(table, insert_values(self, table, values, clock)), Shape.ROW, table)))
        return bool((yield from execute(stmt, params(values)))[0])

    def read(self, table: Table, key: Mapping[str, str]) -> Flow[Any]:
        row = yield from super().read(table, key)
        if row is None:
            level = yield from execute(self.prepared("isolation", lambda: statement(text(
                "SELECT transaction_isolation_level FROM sys.dm_exec_sessions WHERE session_id = @@SPID"),
                Shape.ROW)))
            if level is not None and level[0] == _ISOLATION_SNAPSHOT:
                # The insert just failed on this key, so the row exists: our snapshot predates its commit.
                raise WinnerNotVisible(table.name)
        return row

    def not_waiting(self, table: Table, key: Mapping[str, str], claim: Flow[Any]) -> Flow[Any]:
        row = yield from execute(self.prepared("lock timeout", lambda: statement(_LOCK_TIMEOUT_NOW, Shape.ROW)))
        previous = int(row[0])

        def lock_timeout(ms: int) -> Flow[None]:  # SET LOCK_TIMEOUT takes a literal; an int read just now
            yield from execute(statement(text(f"SET LOCK_TIMEOUT {ms}"), Shape.NOTHING))

        return (yield from set_during(lock_timeout, 0, previous, claim))  # session state

    def lock_batch(self, table: Table, columns: Sequence[ColumnElement[Any]], condition: ColumnElement[bool],
                   order_by: Sequence[ColumnElement[Any]], limit: int) -> Flow[list[Any]]:
        """``SELECT TOP (n) ... FROM t WITH (UPDLOCK, READPAST, ROWLOCK) WHERE ... ORDER BY ...``: update locks on
        the rows taken (so a second relay cannot take them), rows other transactions have locked read past, row
        locks rather than a page's (SQL Server has no FOR UPDATE)."""
        stmt = self.prepared(("lock batch", table, condition, limit), lambda: statement(
            select(*columns).with_hint(table, "WITH (UPDLOCK, READPAST, ROWLOCK)").where(condition)
            .order_by(*order_by).limit(limit), Shape.ROWS, table))
        return list((yield from execute(stmt)))

    def purge_batch(self, table: Table, condition: ColumnElement[bool], limit: int,
                    values: Mapping[str, Any] | None = None) -> Flow[int]:
        # One statement, the batch size bounding the locks it takes; `limit` is a validated int.
        return (yield from rowcount(self.prepared(("purge", table, condition, limit), lambda: statement(
            delete(table).where(condition).prefix_with(f"TOP ({int(limit)})"), Shape.ROWCOUNT, table)), values))

    # --- operations ------------------------------------------------------------------------------------------

    @property
    def db_system_name(self) -> str:
        return "microsoft.sql_server"

    def migration_table(self, table: Table) -> None:
        _nonclustered_primary_key(table)  # what the before_create listener of `columns` does at create time
