"""Oracle backend without a server: every statement compiled by SQLAlchemy's real Oracle dialect, error
classification on the exception objects python-oracledb itself raises, and the guards that act before SQL.

Live behaviour (waiting on an uncommitted duplicate, NLS_COMP=LINGUISTIC sessions, ORA-08177 under load) is the
conformance suite's job on oracle-23 / oracle-26 when a server is provided.

Exact values, error classification and run's retries: tests/test_oracle_errors.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from offline_common import run
from ora_common import *  # noqa: F403  (fixtures: backend, engine)
from ora_common import CLOSED_PORT_URL, ORA_00001, REQ, Result, ScriptedConnection, ora_error, sql, winner_row, wrapped
from sqlalchemy import create_engine, event
from sqlalchemy.dialects import oracle
from sqlalchemy.engine import Engine
from sqlalchemy.schema import CreateIndex, CreateTable

from idem_dialects import Claimed, IdempotencyStore, InvalidKey, Replayed, dialects
from idem_dialects.dialects import load
from idem_dialects.dialects.oracle import (
    KEY_BYTES,
    OracleBackend,
)
from idem_dialects.errors import RetryCause, WinnerNotVisible
from idem_dialects.fingerprint import fingerprint, payload_fingerprint
from idem_dialects.schema import build_tables

# --- registry, laziness, capabilities ----------------------------------------------------------------------------


def test_registry_and_isolation_levels() -> None:
    assert load("oracle") is OracleBackend
    features = OracleBackend.url_features(create_engine(CLOSED_PORT_URL).url)
    assert features.isolation_levels == ("READ COMMITTED", "SERIALIZABLE")


def test_driver_imports_stay_lazy() -> None:
    """Importing idem_dialects, loading and building the Oracle backend and its tables never imports oracledb."""
    code = (
        "import sys\n"
        "import idem_dialects\n"
        "from idem_dialects import dialects\n"
        "from idem_dialects.schema import build_tables\n"
        "from sqlalchemy import create_mock_engine\n"
        "assert 'oracledb' not in sys.modules, 'import idem_dialects'\n"
        "backend = dialects.load('oracle')(create_mock_engine('oracle://', lambda *a, **k: None))\n"
        "build_tables('idem_', backend)\n"
        "assert 'oracledb' not in sys.modules, 'building the backend'\n"
        "assert 'idem_dialects.dialects.oracle' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# --- the empty-value guards, before any connection -------------------------------------------------------------


@pytest.fixture
def unreachable_store() -> Iterator[tuple[IdempotencyStore, list[Any]]]:
    """A store on a closed port; records (and refuses) every connection attempt."""
    attempts: list[Any] = []
    store = IdempotencyStore.from_url(CLOSED_PORT_URL, table_prefix="idem_")

    @event.listens_for(store.engine, "do_connect")
    def refuse(*args: Any) -> None:
        attempts.append(args)
        raise AssertionError("no connection may be attempted")

    yield store, attempts
    store.engine.dispose()


@pytest.mark.parametrize("field", ["scope", "operation", "key"])
def test_empty_identity_rejected_in_run_before_connecting(
    unreachable_store: tuple[IdempotencyStore, list[Any]], field: str
) -> None:
    store, attempts = unreachable_store
    assert type(store.backend) is dialects.load("oracle") and attempts == []  # building the store did not connect
    args: dict[str, Any] = dict(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: 1)
    args[field] = ""
    with pytest.raises(InvalidKey) as err:
        store.run(**args)
    assert err.value.field == field and "empty" in err.value.rule
    assert attempts == []


@pytest.mark.parametrize("field", ["scope", "operation", "key"])
def test_empty_identity_rejected_in_claim_before_touching_the_connection(
    unreachable_store: tuple[IdempotencyStore, list[Any]], field: str
) -> None:
    store, attempts = unreachable_store
    args: dict[str, Any] = dict(scope="s", operation="op", key="k", request=REQ)
    args[field] = ""
    untouchable = object()  # any use of the connection would raise AttributeError, not InvalidKey
    with pytest.raises(InvalidKey) as err:
        store.claim(untouchable, **args)  # type: ignore[arg-type]
    assert err.value.field == field
    assert attempts == []


@pytest.mark.parametrize(("column", "field"), [("scope", "scope"), ("operation", "operation"), ("idem_key", "key")])
def test_backend_insert_guards_identity_itself(backend: OracleBackend, engine: Engine, column: str, field: str) -> None:
    """insert_if_absent refuses '' (which Oracle would make NULL) before executing anything, for any caller."""
    t = build_tables("idem_", backend).records
    values = dict(scope="s", operation="op", idem_key="k", fingerprint="f" * 64, claim_token="c" * 32)
    values[column] = ""
    conn = ScriptedConnection(engine, [])
    with pytest.raises(InvalidKey) as err:
        run(backend.insert_if_absent(t, values), conn)
    assert err.value.field == field and conn.statements == []
    messages = build_tables("idem_", backend).messages
    with pytest.raises(InvalidKey):
        run(backend.insert_if_absent(messages, dict(subscriber="sub", message_id="")), conn)


# --- DDL --------------------------------------------------------------------------------------------------------


def test_table_ddl_column_types(backend: OracleBackend) -> None:
    tables = build_tables("idem_", backend)
    records = sql(CreateTable(tables.records))
    for col in ("scope", "operation", "idem_key"):
        assert f"{col} RAW({KEY_BYTES}) NOT NULL" in records  # bytes compare as bytes: no NLS, no charset
    assert KEY_BYTES == 1020
    assert "fingerprint VARCHAR2(64 CHAR) NOT NULL" in records
    assert "claim_token VARCHAR2(64 CHAR) NOT NULL" in records
    for col in ("created_at", "locked_until"):
        assert f"{col} TIMESTAMP NOT NULL" in records  # not DATE: keeps fractional seconds
    assert "completed_at TIMESTAMP," in records
    assert "status INTEGER," in records
    assert "response BLOB" in records
    assert "CONSTRAINT idem_records_pk PRIMARY KEY (scope, operation, idem_key)" in records
    assert "VARCHAR2(255" not in records and "COLLATE" not in records  # needs no MAX_STRING_SIZE=EXTENDED
    messages = sql(CreateTable(tables.messages))
    assert f"subscriber RAW({KEY_BYTES}) NOT NULL" in messages
    assert f"message_id RAW({KEY_BYTES}) NOT NULL" in messages
    assert "fingerprint VARCHAR2(64 CHAR)," in messages  # NULL means "no payload", by design
    assert "processed_at TIMESTAMP NOT NULL" in messages
    # The primary key index: 3 x 1020 bytes, within the 6398-byte key limit of an 8K block (ORA-01450).
    assert 3 * KEY_BYTES < 6398


@pytest.mark.parametrize("prefix", ["a", "idem_", "a" * 20, "z9_" + "x" * 17])
def test_identifiers_fit_oracle(backend: OracleBackend, prefix: str) -> None:
    """Every name the longest accepted prefix yields fits Oracle's 128-byte identifiers (12.2+; 23ai/26ai) and
    needs no quoting (unquoted names fold to upper case, so DDL and queries agree)."""
    tables = build_tables(prefix, backend)
    dialect = oracle.dialect()
    assert dialect.max_identifier_length == 128
    names = []
    for table in (tables.records, tables.messages):
        ddl = sql(CreateTable(table), dialect)  # raises IdentifierError if a name were too long
        assert '"' not in ddl
        names.append(table.name)
        names += [c.name for c in table.constraints if isinstance(c.name, str)]
        for index in table.indexes:
            assert '"' not in sql(CreateIndex(index), dialect)
            names.append(str(index.name))
    assert max(len(n.encode()) for n in names) <= 128
    assert any(n == f"{prefix}records_done_ix" for n in names)


# --- statements -------------------------------------------------------------------------------------------------


def test_clock_is_the_database_utc_timestamp(backend: OracleBackend, engine: Engine) -> None:
    assert sql(backend.now()) == "sys_extract_utc(SYSTIMESTAMP)"
    later = backend.now_plus(90.25).compile(dialect=engine.dialect)
    assert " ".join(str(later).split()) == "sys_extract_utc(SYSTIMESTAMP) + numtodsinterval(:param_1, 'SECOND')"
    assert str(later.params["param_1"]) == "90.250000"  # exact decimal, microseconds
    assert str(backend.now_plus(-3600).compile(dialect=engine.dialect).params["param_1"]) == "-3600.000000"
    assert isinstance(backend.now().type, type(backend.columns.timestamp))


def test_claim_is_one_plain_insert_with_utf8_key_bytes(backend: OracleBackend, engine: Engine) -> None:
    """The claim: one INSERT (no hint, MERGE or savepoint), identity bound as exact UTF-8 bytes, times from the
    database clock."""
    store = IdempotencyStore(engine)
    conn = ScriptedConnection(engine, [Result()])
    outcome = store.claim(conn, scope="Tenant ", operation="debit:v1", key="Straße  ", request=REQ)  # type: ignore[arg-type]
    assert isinstance(outcome, Claimed)
    [(text, params)] = conn.statements
    assert text == (
        "INSERT INTO idem_records (scope, operation, idem_key, fingerprint, claim_token, created_at, locked_until)"
        " VALUES (:v_scope, :v_operation, :v_idem_key, :v_fingerprint, :v_claim_token, sys_extract_utc(SYSTIMESTAMP),"
        " sys_extract_utc(SYSTIMESTAMP))"
    )
    assert params["v_scope"] == b"Tenant " and params["v_idem_key"] == "Straße  ".encode()  # trailing spaces kept
    assert params["v_fingerprint"] == fingerprint(REQ) and len(params["v_claim_token"]) == 32
    assert "IGNORE_ROW_ON_DUPKEY_INDEX" not in text.upper() and "MERGE" not in text.upper()


def test_leased_claim_sets_lease_from_db_clock(engine: Engine) -> None:
    store = IdempotencyStore(engine)
    conn = ScriptedConnection(engine, [Result()])
    store.claim(conn, scope="s", operation="op", key="k", request=REQ, lease=timedelta(seconds=90))  # type: ignore[arg-type]
    [(text, params)] = conn.statements
    assert "(sys_extract_utc(SYSTIMESTAMP) + numtodsinterval(:param_1, 'SECOND'))" in text
    assert params["param_1"] == Decimal("90.000000") and isinstance(params["param_1"], Decimal)  # NUMBER, exact


def test_loser_reads_committed_winner_and_replays(engine: Engine) -> None:
    """ORA-00001 after waiting on the winner (READ COMMITTED): the next statement sees the committed winner.
    The read is a plain consistent read by primary key (no FOR UPDATE, no NLS functions) plus the DB clock."""
    store = IdempotencyStore(engine)
    dup = wrapped(ora_error(1, ORA_00001), engine)
    conn = ScriptedConnection(engine, [dup, Result(winner_row(fingerprint(REQ), "", 201))])
    outcome = store.claim(conn, scope="s", operation="op", key="k", request=REQ)  # type: ignore[arg-type]
    assert outcome == Replayed("", 201, datetime(2026, 1, 1, 12, 0, 0))  # "" did not come back as None
    read_sql, read_params = conn.statements[1]
    assert read_sql == (
        "SELECT idem_records.fingerprint, idem_records.claim_token, idem_records.locked_until,"
        " idem_records.completed_at, idem_records.status, idem_records.response,"
        " sys_extract_utc(SYSTIMESTAMP) AS db_now FROM idem_records"
        " WHERE idem_records.scope = :k_scope AND idem_records.operation = :k_operation"
        " AND idem_records.idem_key = :k_idem_key"
    )
    assert read_params == {"k_scope": b"s", "k_operation": b"op", "k_idem_key": b"k"}
    assert "FOR UPDATE" not in read_sql and "NLSSORT" not in read_sql.upper()


def test_winner_rolled_back_means_claim(engine: Engine) -> None:
    """An INSERT that waited on an uncommitted duplicate succeeds when the winner rolls back: a claim."""
    store = IdempotencyStore(engine)
    conn = ScriptedConnection(engine, [Result()])
    assert isinstance(store.claim(conn, scope="s", operation="op", key="k", request=REQ), Claimed)  # type: ignore[arg-type]


def test_winner_gone_between_insert_and_read_claims_again(engine: Engine) -> None:
    """READ COMMITTED: the winner purged/released after our ORA-00001 reads as nothing; the store inserts again."""
    store = IdempotencyStore(engine)
    dup = wrapped(ora_error(1, ORA_00001), engine)
    conn = ScriptedConnection(engine, [dup, Result(None), Result()])
    assert isinstance(store.claim(conn, scope="s", operation="op", key="k", request=REQ), Claimed)  # type: ignore[arg-type]
    assert [s.split()[0] for s, _ in conn.statements] == ["INSERT", "SELECT", "INSERT"]


def test_serializable_snapshot_hiding_the_winner_is_retryable() -> None:
    """SERIALIZABLE reads as of the transaction's start: a winner committed later is invisible to the loser.
    The backend raises WinnerNotVisible, which run retries as a serialization failure (like ORA-08177). The
    backend's flows never see the connection: the engine's configured level is what they know."""
    eng = create_engine(CLOSED_PORT_URL, isolation_level="SERIALIZABLE")
    store = IdempotencyStore(eng)
    dup = wrapped(ora_error(1, ORA_00001), eng)
    conn = ScriptedConnection(eng, [dup, Result(None)])
    with pytest.raises(WinnerNotVisible) as err:
        store.claim(conn, scope="s", operation="op", key="k", request=REQ)  # type: ignore[arg-type]
    assert err.value.table == store.tables.records.name
    assert store.retry_cause(err.value) == RetryCause.SERIALIZATION
    eng.dispose()


@pytest.mark.parametrize(("engine_level", "option", "raises"), [
    ("SERIALIZABLE", None, True),  # create_engine(isolation_level="SERIALIZABLE"), as the conformance suite does
    # The engine's level decides: a flow never sees the connection, so a per-connection execution option is not
    # read. A READ COMMITTED connection of a SERIALIZABLE engine gets WinnerNotVisible (run retries it); a
    # SERIALIZABLE connection of a READ COMMITTED engine inserts again (on a live server, where the winner stays
    # invisible, its claim loop ends in ClaimRaced, which run also retries).
    ("SERIALIZABLE", "READ COMMITTED", True),
    (None, "SERIALIZABLE", False),
    (None, None, False),  # READ COMMITTED, Oracle's default: the winner was purged or released; claim again
])
def test_serializable_detected_from_sqlalchemy_configuration(engine_level: str | None, option: str | None,
                                                             raises: bool) -> None:
    eng = create_engine(CLOSED_PORT_URL, **({"isolation_level": engine_level} if engine_level else {}))
    store = IdempotencyStore(eng)
    dup = wrapped(ora_error(1, ORA_00001), eng)
    conn = ScriptedConnection(eng, [dup, Result(None), Result()], isolation_level=option)
    if raises:
        with pytest.raises(WinnerNotVisible):
            store.claim(conn, scope="s", operation="op", key="k", request=REQ)  # type: ignore[arg-type]
    else:
        assert isinstance(store.claim(conn, scope="s", operation="op", key="k", request=REQ), Claimed)  # type: ignore[arg-type]
    eng.dispose()


def test_accept_message_duplicate_is_not_an_error(engine: Engine) -> None:
    store = IdempotencyStore(engine)
    dup = wrapped(ora_error(1, ORA_00001.replace("RECORDS", "MESSAGES")), engine)
    row = SimpleNamespace(fingerprint=payload_fingerprint(b""))
    conn = ScriptedConnection(engine, [dup, Result(row)])
    assert store.accept_message(conn, subscriber="sub", message_id="m", payload=b"") is False  # type: ignore[arg-type]
    insert_sql, params = conn.statements[0]
    assert insert_sql.startswith("INSERT INTO idem_messages (subscriber, message_id, fingerprint, processed_at)")
    assert params["v_fingerprint"] == payload_fingerprint(b"") and params["v_message_id"] == b"m"


def test_complete_is_a_fenced_update(engine: Engine) -> None:
    """The store's complete: one UPDATE fenced on the record, its claim token and still being in flight; the
    response is stored with its kind tag, so empty bytes never reach Oracle as b'' (NULL)."""
    store = IdempotencyStore(engine)
    claimed = Claimed("s", "op", "k", fingerprint(REQ), "c" * 32, leased=False)
    conn = ScriptedConnection(engine, [Result(rowcount=1)])
    store.complete(conn, claimed, b"", status=200)  # type: ignore[arg-type]
    [(text, params)] = conn.statements
    assert text == (
        "UPDATE idem_records SET locked_until=sys_extract_utc(SYSTIMESTAMP),"
        " completed_at=sys_extract_utc(SYSTIMESTAMP),"
        " status=:v_status, response=:v_response WHERE idem_records.scope = :w_scope"
        " AND idem_records.operation = :w_operation AND idem_records.idem_key = :w_idem_key"
        " AND idem_records.claim_token = :w_claim_token AND idem_records.completed_at IS NULL"
    )
    assert params["v_response"] == b"b" and params["w_idem_key"] == b"k" and params["w_claim_token"] == "c" * 32


def test_purge_deletes_a_bounded_batch_by_rowid(backend: OracleBackend, engine: Engine) -> None:
    t = build_tables("idem_", backend).records
    condition = t.c.completed_at < backend.now_plus(-60)
    conn = ScriptedConnection(engine, [Result(rowcount=3)])
    assert run(backend.purge_batch(t, condition, 3), conn) == 3
    [(text, params)] = conn.statements
    assert text == (
        "DELETE FROM idem_records WHERE ROWID IN (SELECT ROWID FROM idem_records"
        " WHERE idem_records.completed_at < sys_extract_utc(SYSTIMESTAMP) + numtodsinterval(:param_1, 'SECOND')"
        " AND ROWNUM <= :param_2)"
        " AND idem_records.completed_at < sys_extract_utc(SYSTIMESTAMP) + numtodsinterval(:param_1, 'SECOND')"
    )
    assert params["param_2"] == 3 and str(params["param_1"]) == "-60.000000"
