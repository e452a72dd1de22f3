"""SQL Server backend without a server: every statement it issues compiled by SQLAlchemy's real mssql (pyodbc)
dialect, its error classification on real pyodbc exception objects, its key encoding, and that building a store
from a URL neither connects nor imports the driver early. The live protocol runs in the conformance suite
(IDEM_URL_MSSQL_2022 / IDEM_URL_MSSQL_2025)."""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import and_, create_mock_engine, event, or_, select
from sqlalchemy.dialects.mssql import VARBINARY
from sqlalchemy.dialects.mssql import pyodbc as mssql_pyodbc
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, IntegrityError, ProgrammingError

from idem_dialects import IdempotencyStore, InvalidKey
from idem_dialects.dialects import load
from idem_dialects.dialects.mssql import (
    INDEX_KEY_LIMIT,
    KEY_BYTES,
    InsertIfAbsent,
    MSSQLBackend,
    native_error,
)
from idem_dialects.dialects.types import Utf8Bytes
from idem_dialects.errors import RetryCause, WinnerNotVisible
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


# --- schema: key types, collations, the 900-byte clustered key --------------------------------------------------


def test_ddl_key_columns_are_utf8_varbinary_with_nonclustered_pk(tables: Tables) -> None:
    """Identity columns are VARBINARY(1020) (255 characters of UTF-8, no collation: byte-exact); the primary keys are
    NONCLUSTERED (1700-byte key limit, where 900 could not hold a 255-character 4-byte key with its scope and
    operation); tokens are BIN2 varchar, times DATETIME2, responses VARBINARY(max). DDL from the real mssql dialect."""
    ddl: list[str] = []
    mock = create_mock_engine(URL, lambda stmt, *a, **k: ddl.append(str(stmt.compile(dialect=mock.dialect))))
    tables.metadata.create_all(mock, checkfirst=False)
    text = "\n".join(ddl)
    for column in ("scope", "operation", "idem_key", "subscriber", "message_id"):
        assert re.search(rf"\b{column} VARBINARY\(1020\) NOT NULL", text), column
    assert "CONSTRAINT idem_records_pk PRIMARY KEY NONCLUSTERED (scope, operation, idem_key)" in text
    assert "CONSTRAINT idem_messages_pk PRIMARY KEY NONCLUSTERED (subscriber, message_id)" in text
    assert "fingerprint VARCHAR(64) COLLATE Latin1_General_100_BIN2 NOT NULL" in text
    assert "claim_token VARCHAR(64) COLLATE Latin1_General_100_BIN2 NOT NULL" in text
    for column in ("created_at", "locked_until", "processed_at"):
        assert re.search(rf"\b{column} DATETIME2 NOT NULL", text), column
    assert "completed_at DATETIME2 NULL" in text and "response VARBINARY(max) NULL" in text
    assert "CREATE INDEX idem_records_done_ix ON idem_records (completed_at)" in text
    assert "NVARCHAR" not in text and "IMAGE" not in text
    assert KEY_BYTES == 255 * 4 and INDEX_KEY_LIMIT == 1700


def test_tables_never_use_output_inserted(tables: Tables) -> None:
    """implicit_returning is off: no OUTPUT inserted.* that SQL Server rejects on a table with triggers."""
    assert tables.records.implicit_returning is False and tables.messages.implicit_returning is False


# --- keys: byte-exact whatever the collation -----------------------------------------------------------------------

DISTINCT_KEYS = [
    "key", "Key", "KEY", "key ", "key  ", " key", "k ey", "key\t", "key\u00a0", "key\u3000", "key\n",
    unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café"), "cafe",
    "\u00df", "ss", "\u1e9e", "\u0130", "i", "\u0131", "\ufb01", "fi", "\U0001f600", "\U0001f601", "\U0001f600 ",
    "\u00c5", "\u212b", "A\u030a",
]


def test_distinct_keys_store_distinct_bytes(dialect: Dialect) -> None:
    """Keys that differ in case, accents, normalization form, whitespace anywhere (trailing included) or in 4-byte
    characters bind different bytes (their UTF-8), none containing 0x00 (so no binary padding rule can merge them),
    and read back exactly."""
    key = Utf8Bytes(VARBINARY(KEY_BYTES))
    bind, result = key.bind_processor(dialect), key.result_processor(dialect, None)
    assert bind is not None and result is not None
    encoded = [bind(k) for k in DISTINCT_KEYS]
    assert len(set(DISTINCT_KEYS)) == len(DISTINCT_KEYS) == len(set(encoded))
    for key, stored in zip(DISTINCT_KEYS, encoded, strict=True):
        assert stored == key.encode("utf-8") and b"\x00" not in stored
        assert result(stored) == key
    assert bind("k ") == b"k " != bind("k")  # VARBINARY compares the trailing space; NVARCHAR would ignore it


# The conformance suite's longest identities (conformance/test_keys.py): each fits the 1700-byte index key.
LONG = ["x" * 255, "\u00e9" * 255, "\U0001f600" * 255, "\U0001f600" * 254 + "\U0001f601"]


@pytest.mark.parametrize("field", ["scope", "operation", "idem_key"])
@pytest.mark.parametrize("value", LONG, ids=["ascii", "2-byte", "4-byte", "4-byte-last-differs"])
def test_255_character_identities_fit_the_index(backend: MSSQLBackend, tables: Tables, field: str,
                                                value: str) -> None:
    values = claim_values(backend)
    values[field] = value
    conn = FakeConnection(1)
    assert backend.insert_if_absent(conn, tables.records, values) is True  # type: ignore[arg-type]
    assert len(value.encode()) <= KEY_BYTES


def test_identity_beyond_the_index_limit_is_refused_before_sql(backend: MSSQLBackend, tables: Tables) -> None:
    """Three 255-character fields of 3-byte characters (2295 bytes) cannot be indexed: InvalidKey, no SQL; all three
    at 255 ASCII characters (765 bytes) fit."""
    values = claim_values(backend)
    values.update(scope="\u4e00" * 255, operation="\u4e00" * 255, idem_key="\u4e00" * 254 + "x")
    conn = FakeConnection()
    with pytest.raises(InvalidKey) as err:
        backend.insert_if_absent(conn, tables.records, values)  # type: ignore[arg-type]
    assert err.value.field == "scope" and "2293 bytes" in err.value.rule and conn.statements == []
    values.update(scope="s" * 255, operation="o" * 255, idem_key="k" * 255)
    assert backend.insert_if_absent(FakeConnection(1), tables.records, values) is True  # type: ignore[arg-type]
    messages = dict(subscriber="\U0001f600" * 255, message_id="\U0001f601" * 255)
    with pytest.raises(InvalidKey):
        backend.insert_if_absent(FakeConnection(), tables.messages, messages)  # type: ignore[arg-type]


# --- the claim statement -------------------------------------------------------------------------------------------


CLAIM_CLOCK = {"created_at": 0.0, "locked_until": 90.5}  # the database clock, and a 90.5 s lease


def claim_values(backend: MSSQLBackend, key: str = "k ") -> dict[str, Any]:
    return dict(scope="acct:1", operation="debit:v1", idem_key=key, fingerprint="f" * 64, claim_token="a" * 32)


def test_private_compiler_stack_still_exists(dialect: Dialect) -> None:
    """The claim batch compiles its INSERT as a nested statement by pushing onto SQLCompiler.stack, which has no
    public equivalent. If SQLAlchemy renames or reshapes it, this fails (instead of the batch running as an INSERT
    whose result row is discarded)."""
    compiler = dialect.statement_compiler(dialect, None)
    assert isinstance(compiler.stack, list) and compiler.stack == []


def test_claim_is_one_batch_around_a_plain_insert(backend: MSSQLBackend, tables: Tables, dialect: Dialect) -> None:
    """The claim: XACT_ABORT off around a plain INSERT (the PK resolves the race), 2627/2601 caught by number while
    the transaction is committable, everything else re-thrown, settings restored, one row saying if it inserted.
    No MERGE, no OUTPUT, no range-locking NOT EXISTS."""
    values = backend.insert_values(tables.records, claim_values(backend), CLAIM_CLOCK)
    compiled = InsertIfAbsent(tables.records, values).compile(dialect=dialect)
    text = str(compiled)
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0] == "DECLARE @idem_options int = @@OPTIONS, @idem_inserted int = 1;"
    assert lines[1:4] == ["SET NOCOUNT ON;", "SET XACT_ABORT OFF;", "BEGIN TRY"]
    assert lines[4] == ("INSERT INTO idem_records (scope, operation, idem_key, fingerprint, claim_token, created_at, "
                        "locked_until) VALUES (?, ?, ?, ?, ?, sysutcdatetime(), "
                        "dateadd(second, 90, dateadd(microsecond, 500000, sysutcdatetime())));")
    catch = text[text.index("BEGIN CATCH"):text.index("END CATCH")]
    assert "IF @idem_options & 16384 <> 0 SET XACT_ABORT ON;" in catch
    assert "IF @idem_options & 512 = 0 SET NOCOUNT OFF;" in catch
    assert re.search(r"IF ERROR_NUMBER\(\) IN \(2627, 2601\) AND XACT_STATE\(\) <> -1\s+SET @idem_inserted = 0;"
                     r"\s+ELSE\s+THROW;", catch)
    # The restore comes before the re-THROW (so the error honours XACT_ABORT) and again after the TRY.
    assert catch.index("SET XACT_ABORT ON") < catch.index("THROW")
    tail = text[text.index("END CATCH;"):]
    assert "SET XACT_ABORT ON" in tail and "SET NOCOUNT OFF" in tail
    assert lines[-1] == "SELECT @idem_inserted AS inserted;"
    for banned in ("MERGE", "OUTPUT", "HOLDLOCK", "UPDLOCK", "SAVE TRANSACTION"):
        assert banned not in text.upper()
    assert compiled.isinsert is False  # the batch executes as a statement returning a row, not as an INSERT
    assert compiled.positiontup == ["v_scope", "v_operation", "v_idem_key", "v_fingerprint", "v_claim_token"]
    for name in ("v_scope", "v_operation", "v_idem_key"):
        assert isinstance(compiled.binds[name].type, Utf8Bytes)


def test_message_claim_uses_the_same_batch(backend: MSSQLBackend, tables: Tables, dialect: Dialect) -> None:
    values = dict(subscriber="sub", message_id="m-1", fingerprint=None)
    insert_values = backend.insert_values(tables.messages, values, {"processed_at": 0.0})
    text = str(InsertIfAbsent(tables.messages, insert_values).compile(dialect=dialect))
    assert "INSERT INTO idem_messages (subscriber, message_id, fingerprint, processed_at) VALUES (?, ?, ?, " \
           "sysutcdatetime());" in text
    assert "SET XACT_ABORT OFF;" in text and "THROW;" in text


def test_insert_if_absent_reports_the_batch_row(backend: MSSQLBackend, tables: Tables) -> None:
    """True when the batch inserted, False on a duplicate it caught; anything it re-threw propagates as raised."""
    conn = FakeConnection(1, 0, pyodbc_error(ODBC18, "23000", 515))
    assert backend.insert_if_absent(conn, tables.records, claim_values(backend)) is True  # type: ignore[arg-type]
    assert backend.insert_if_absent(conn, tables.records, claim_values(backend)) is False  # type: ignore[arg-type]
    with pytest.raises(IntegrityError):
        backend.insert_if_absent(conn, tables.records, claim_values(backend))  # type: ignore[arg-type]
    assert all(isinstance(s, InsertIfAbsent) for s in conn.statements)


# --- reading the winner --------------------------------------------------------------------------------------------


def test_winner_read_is_a_plain_select_with_db_clock(backend: MSSQLBackend, tables: Tables, dialect: Dialect) -> None:
    """The loser reads by primary key with the DB clock, no NOLOCK/READPAST hint (it must see committed data)."""
    conn = FakeConnection(("row",))
    ident = {"scope": "s", "operation": "op", "idem_key": "k"}
    assert backend.read_row(conn, tables.records, ident) == ("row",)  # type: ignore[arg-type]
    text = sql(conn.statements[0], dialect)
    assert text.startswith("SELECT idem_records.scope, idem_records.operation, idem_records.idem_key")
    assert text.endswith("sysutcdatetime() AS db_now FROM idem_records WHERE idem_records.scope = ? AND "
                         "idem_records.operation = ? AND idem_records.idem_key = ?")
    assert "WITH (" not in text.upper() and "NOLOCK" not in text.upper()


def test_snapshot_hiding_the_winner_is_retryable(backend: MSSQLBackend, tables: Tables) -> None:
    """Under SNAPSHOT (isolation level 5) a winner committed after the snapshot began is invisible: read_row raises
    WinnerNotVisible, which `run` retries as a serialization failure. Under other levels an absent row is absent."""
    ident = {"scope": "s", "operation": "op", "idem_key": "k"}
    snapshot = FakeConnection(None, 5)
    with pytest.raises(WinnerNotVisible) as err:
        backend.read_row(snapshot, tables.records, ident)  # type: ignore[arg-type]
    assert backend.retry_cause(err.value) == RetryCause.SERIALIZATION
    assert "sys.dm_exec_sessions" in str(snapshot.statements[1])
    assert backend.read_row(FakeConnection(None, 2), tables.records, ident) is None  # type: ignore[arg-type]


# --- the clock and retention ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "expected"), [
    (0, "sysutcdatetime()"),
    (0.5, "dateadd(microsecond, 500000, sysutcdatetime())"),
    (-86400 * 30, "dateadd(day, -30, sysutcdatetime())"),
    (-(86400 * 400 + 3661.25), "dateadd(day, -400, dateadd(second, -3661, dateadd(microsecond, -250000, "
                               "sysutcdatetime())))"),
    (10**12, "dateadd(day, 700000, sysutcdatetime())"),  # clamped inside DATETIME2's range
])
def test_db_clock(backend: MSSQLBackend, dialect: Dialect, seconds: float, expected: str) -> None:
    """Times come from SYSUTCDATETIME(); offsets are split so every DATEADD amount fits an int."""
    assert sql(backend.now_plus(seconds), dialect) == expected
    assert type(backend.now_plus(seconds).type).__name__ == "DATETIME2"


def test_purge_deletes_in_top_n_batches(backend: MSSQLBackend, tables: Tables, dialect: Dialect) -> None:
    """Purge is DELETE TOP (n) with the store's condition (completed or abandoned, older than the cutoff)."""
    r = tables.records.c
    cutoff = backend.now_plus(-timedelta(hours=24).total_seconds())
    condition = or_(and_(r.completed_at.is_not(None), r.completed_at < cutoff),
                    and_(r.completed_at.is_(None), r.locked_until < backend.now(), r.created_at < cutoff))
    conn = FakeConnection(3)
    assert backend.purge_batch(conn, tables.records, condition, 3) == 3  # type: ignore[arg-type]
    assert sql(conn.statements[0], dialect) == (
        "DELETE TOP (3) FROM idem_records WHERE idem_records.completed_at IS NOT NULL AND idem_records.completed_at"
        " < dateadd(day, -1, sysutcdatetime()) OR idem_records.completed_at IS NULL AND idem_records.locked_until"
        " < sysutcdatetime() AND idem_records.created_at < dateadd(day, -1, sysutcdatetime())")


# --- error classification on real pyodbc exceptions ---------------------------------------------------------------

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


DRIVERS = pytest.mark.parametrize("driver", [ODBC18, FREETDS], ids=["odbc18", "freetds"])


@DRIVERS
@pytest.mark.parametrize("number", [2627, 2601])
def test_duplicates_recognised_by_number(backend: MSSQLBackend, driver: str, number: int) -> None:
    """2627 (PK/unique constraint) and 2601 (unique index) are duplicates, from either driver, whatever class."""
    exc = pyodbc_error(driver, None, number)
    assert native_error(exc) == number
    assert backend.is_duplicate(exc) and backend.retry_cause(exc) is None


def test_freetds_2601_arrives_as_programming_error(backend: MSSQLBackend) -> None:
    exc = pyodbc_error(FREETDS, None, 2601)
    assert isinstance(exc, ProgrammingError) and backend.is_duplicate(exc)


@DRIVERS
@pytest.mark.parametrize("number", [515, 547])
def test_other_integrity_errors_are_not_duplicates(backend: MSSQLBackend, driver: str, number: int) -> None:
    exc = pyodbc_error(driver, None, number)
    assert native_error(exc) == number
    assert not backend.is_duplicate(exc) and backend.retry_cause(exc) is None


@DRIVERS
@pytest.mark.parametrize(("number", "cause"), [(1205, RetryCause.DEADLOCK), (1222, RetryCause.LOCK_TIMEOUT),
                                               (3960, RetryCause.SERIALIZATION)])
def test_retryable_errors(backend: MSSQLBackend, driver: str, number: int, cause: str) -> None:
    """Deadlock victim, lock timeout and snapshot update conflict are retried by `run`; they are not duplicates."""
    exc = pyodbc_error(driver, None, number)
    assert backend.retry_cause(exc) == cause and not backend.is_duplicate(exc)


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
    assert backend.is_duplicate(exc) is (number == 2627)
    assert backend.retry_cause(exc) is None


def test_windows_multi_record_messages(backend: MSSQLBackend) -> None:
    """pyodbc on Windows appends further records ("; [01000] ... The statement has been terminated. (3621)"):
    the number is the first record's, which ends with pyodbc's function name."""
    more = f"; [01000] {ODBC18}The statement has been terminated. (3621)"
    assert native_error(pyodbc_error(ODBC18, None, 2627, more=more)) == 2627
    adversarial = TEXTS[547].replace("fk_child_parent", "x (2627) (SQLExecDirectW); [01000] y")
    exc = pyodbc_error(ODBC18, None, 547, adversarial, more=more)
    assert native_error(exc) == 547 and not backend.is_duplicate(exc)


@pytest.mark.parametrize("function", ["SQLExecDirectW", "SQLExecute", "SQLFetch", "SQLMoreResults", "SQLEndTran"])
def test_any_odbc_function_name(backend: MSSQLBackend, function: str) -> None:
    assert backend.retry_cause(pyodbc_error(FREETDS, None, 1205, function=function)) == RetryCause.DEADLOCK


def test_unparseable_or_foreign_errors_are_not_classified(backend: MSSQLBackend) -> None:
    """No number, pyodbc's own (message, sqlstate) errors, and other drivers' exceptions classify as nothing."""
    pyodbc = pytest.importorskip("pyodbc")
    for orig in [pyodbc.Error("HY000", "The driver did not supply an error!"),
                 pyodbc.ProgrammingError("Attempt to use a closed cursor.", "HY000"),
                 pyodbc.IntegrityError("23000", "Violation of PRIMARY KEY constraint (2627)"),  # no [state] / function
                 RuntimeError("[23000] [FreeTDS][SQL Server]Violation (2627) (SQLExecDirectW)")]:
        exc = DBAPIError.instance("x", [], orig, pyodbc.Error)
        assert native_error(exc) is None
        assert not backend.is_duplicate(exc) and backend.retry_cause(exc) is None


def test_lost_connection_is_retryable(backend: MSSQLBackend) -> None:
    pyodbc = pytest.importorskip("pyodbc")
    orig = pyodbc.OperationalError("08S01", "[08S01] [FreeTDS][SQL Server]Communication link failure (0) "
                                            "(SQLExecDirectW)")
    exc = DBAPIError.instance("x", [], orig, pyodbc.Error, connection_invalidated=True)
    assert backend.retry_cause(exc) == RetryCause.CONNECTION


# --- building from a URL: no connection, no early driver import --------------------------------------------------


@pytest.fixture
def offline_store() -> Iterator[tuple[IdempotencyStore, list[object]]]:
    pytest.importorskip("pyodbc", reason="pyodbc needs unixODBC (apt-get install unixodbc tdsodbc)")
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
    assert store.backend.name == "mssql" and isinstance(store.backend, MSSQLBackend)
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
    pytest.importorskip("pyodbc", reason="pyodbc needs unixODBC (apt-get install unixodbc tdsodbc)")
    store = IdempotencyStore.from_url(url, table_prefix="app_")
    try:
        assert load("mssql") is MSSQLBackend and type(store.backend) is MSSQLBackend
        assert store.engine.dialect.name == "mssql" and store.engine.dialect.driver == "pyodbc"
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
