"""SQL Server backend without a server: every statement it issues compiled by SQLAlchemy's real mssql (pyodbc)
dialect, its error classification on real pyodbc exception objects, its key encoding, and that building a store
from a URL neither connects nor imports the driver early. The live protocol runs in the conformance suite
(IDEM_URL_MSSQL_2022 / IDEM_URL_MSSQL_2025).

Error classification on real pyodbc exceptions and building from a URL: tests/test_mssql_errors.py.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import timedelta
from typing import Any

import pytest
from mssql_common import *  # noqa: F403  (fixtures: backend, dialect, tables)
from mssql_common import ODBC18, URL, FakeConnection, pyodbc_error, sql
from offline_common import run
from sqlalchemy import and_, create_mock_engine, or_
from sqlalchemy.dialects.mssql import VARBINARY
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import IntegrityError

from idem_dialects import InvalidKey
from idem_dialects.dialects.base import insert_values
from idem_dialects.dialects.mssql import (
    INDEX_KEY_LIMIT,
    KEY_BYTES,
    InsertIfAbsent,
    MSSQLBackend,
)
from idem_dialects.dialects.types import Utf8Bytes
from idem_dialects.errors import RetryCause, WinnerNotVisible
from idem_dialects.schema import Tables

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
    conn = FakeConnection((1,))
    assert run(backend.insert_if_absent(tables.records, values), conn) is True
    assert len(value.encode()) <= KEY_BYTES


def test_identity_beyond_the_index_limit_is_refused_before_sql(backend: MSSQLBackend, tables: Tables) -> None:
    """Three 255-character fields of 3-byte characters (2295 bytes) cannot be indexed: InvalidKey, no SQL; all three
    at 255 ASCII characters (765 bytes) fit."""
    values = claim_values(backend)
    values.update(scope="\u4e00" * 255, operation="\u4e00" * 255, idem_key="\u4e00" * 254 + "x")
    conn = FakeConnection()
    with pytest.raises(InvalidKey) as err:
        run(backend.insert_if_absent(tables.records, values), conn)
    assert err.value.field == "scope" and "2293 bytes" in err.value.rule and conn.statements == []
    values.update(scope="s" * 255, operation="o" * 255, idem_key="k" * 255)
    assert run(backend.insert_if_absent(tables.records, values), FakeConnection((1,))) is True
    messages = dict(subscriber="\U0001f600" * 255, message_id="\U0001f601" * 255)
    with pytest.raises(InvalidKey):
        run(backend.insert_if_absent(tables.messages, messages), FakeConnection())


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
    values = insert_values(backend, tables.records, claim_values(backend), CLAIM_CLOCK)
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
    inserted = insert_values(backend, tables.messages, values, {"processed_at": 0.0})
    text = str(InsertIfAbsent(tables.messages, inserted).compile(dialect=dialect))
    assert "INSERT INTO idem_messages (subscriber, message_id, fingerprint, processed_at) VALUES (?, ?, ?, " \
           "sysutcdatetime());" in text
    assert "SET XACT_ABORT OFF;" in text and "THROW;" in text


def test_insert_if_absent_reports_the_batch_row(backend: MSSQLBackend, tables: Tables) -> None:
    """True when the batch inserted, False on a duplicate it caught; anything it re-threw propagates as raised."""
    conn = FakeConnection((1,), (0,), pyodbc_error(ODBC18, "23000", 515))
    assert run(backend.insert_if_absent(tables.records, claim_values(backend)), conn) is True
    assert run(backend.insert_if_absent(tables.records, claim_values(backend)), conn) is False
    with pytest.raises(IntegrityError):
        run(backend.insert_if_absent(tables.records, claim_values(backend)), conn)
    assert all(isinstance(s, InsertIfAbsent) for s in conn.statements)


# --- reading the winner --------------------------------------------------------------------------------------------


def test_winner_read_is_a_plain_select_with_db_clock(backend: MSSQLBackend, tables: Tables, dialect: Dialect) -> None:
    """The loser reads by primary key with the DB clock, no NOLOCK/READPAST hint (it must see committed data)."""
    conn = FakeConnection(("row",))
    ident = {"scope": "s", "operation": "op", "idem_key": "k"}
    assert run(backend.read(tables.records, ident), conn) == ("row",)
    text = sql(conn.statements[0], dialect)
    assert text.startswith("SELECT idem_records.fingerprint, idem_records.claim_token")  # the key is the caller's
    assert text.endswith("sysutcdatetime() AS db_now FROM idem_records WHERE idem_records.scope = ? AND "
                         "idem_records.operation = ? AND idem_records.idem_key = ?")
    assert "WITH (" not in text.upper() and "NOLOCK" not in text.upper()


def test_snapshot_hiding_the_winner_is_retryable(backend: MSSQLBackend, tables: Tables) -> None:
    """Under SNAPSHOT (isolation level 5) a winner committed after the snapshot began is invisible: `read` raises
    WinnerNotVisible, which `run` retries as a serialization failure. Under other levels an absent row is absent."""
    ident = {"scope": "s", "operation": "op", "idem_key": "k"}
    snapshot = FakeConnection(None, (5,))
    with pytest.raises(WinnerNotVisible) as err:
        run(backend.read(tables.records, ident), snapshot)
    assert backend.errors.retry_cause(err.value) == RetryCause.SERIALIZATION
    assert "sys.dm_exec_sessions" in str(snapshot.statements[1])
    assert run(backend.read(tables.records, ident), FakeConnection(None, (2,))) is None


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
    assert run(backend.purge_batch(tables.records, condition, 3), conn) == 3
    assert sql(conn.statements[0], dialect) == (
        "DELETE TOP (3) FROM idem_records WHERE idem_records.completed_at IS NOT NULL AND idem_records.completed_at"
        " < dateadd(day, -1, sysutcdatetime()) OR idem_records.completed_at IS NULL AND idem_records.locked_until"
        " < sysutcdatetime() AND idem_records.created_at < dateadd(day, -1, sysutcdatetime())")
