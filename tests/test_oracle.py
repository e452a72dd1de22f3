"""Oracle backend without a server: every statement compiled by SQLAlchemy's real Oracle dialect, error
classification on the exception objects python-oracledb itself raises, and the guards that act before SQL.

Live behaviour (waiting on an uncommitted duplicate, NLS_COMP=LINGUISTIC sessions, ORA-08177 under load) is the
conformance suite's job on oracle-23 / oracle-26 when a server is provided.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, event, func, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import oracle
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.schema import CreateIndex, CreateTable

from idem_dialects import Claimed, IdempotencyStore, InvalidKey, InvalidPayload, Replayed, RetriesExhausted, RetryPolicy
from idem_dialects.dialects import load
from idem_dialects.dialects.oracle import (
    KEY_BYTES,
    NonEmptyBlob,
    NonEmptyString,
    OracleBackend,
    ora_code,
)
from idem_dialects.errors import RetryCause, WinnerNotVisible
from idem_dialects.fingerprint import decode_response, encode_response, fingerprint, payload_fingerprint
from idem_dialects.schema import build_tables

oracledb = pytest.importorskip("oracledb")
ora_errors = importlib.import_module("oracledb.errors")  # whose _Error the thin driver raises with (not re-exported)

CLOSED_PORT_URL = "oracle+oracledb://u:p@127.0.0.1:1/?service_name=FREEPDB1"
REQ = {"amount": 100}


# --- helpers ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """An oracle+oracledb engine that is never connected (port 1 is closed): its dialect is the real one."""
    eng = create_engine(CLOSED_PORT_URL)
    yield eng
    eng.dispose()


@pytest.fixture
def backend(engine: Engine) -> OracleBackend:
    return OracleBackend(engine)


def sql(stmt: Any, dialect: Dialect | None = None) -> str:
    return " ".join(str(stmt.compile(dialect=dialect or oracle.dialect())).split())


def bound(compiled: Any, dialect: Dialect, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The parameters as the driver receives them (after each type's bind processor)."""
    out = {}
    for name, value in compiled.construct_params(params).items():
        proc = compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
        out[name] = proc(value) if proc else value
    return out


def ora_error(code: int, message: str) -> Exception:
    """Exactly what python-oracledb thin mode raises for a server error: it builds
    ``errors._Error(message, code=<number from the wire>, offset=...)`` and raises ``error.exc_type(error)``."""
    err = ora_errors._Error(message, code=code, offset=0)
    return err.exc_type(err)  # type: ignore[no-any-return]


def wrapped(orig: Exception, engine: Engine, statement: str = "INSERT INTO idem_records ...") -> sa_exc.DBAPIError:
    """Wrap a driver error the way SQLAlchemy's Connection does (class chosen by name, disconnect detected)."""
    dialect = engine.dialect
    wrapped_exc = sa_exc.DBAPIError.instance(
        statement, {}, orig, dialect.loaded_dbapi.Error,
        connection_invalidated=dialect.is_disconnect(orig, None, None), dialect=dialect,
    )
    assert isinstance(wrapped_exc, sa_exc.DBAPIError)
    return wrapped_exc


ORA_00001 = ("ORA-00001: unique constraint (APP.IDEM_RECORDS_PK) violated on table APP.IDEM_RECORDS columns"
             " (SCOPE, OPERATION, IDEM_KEY)\nORA-03301: (ORA-00001 details) row with column values"
             " (SCOPE:'73', OPERATION:'6F70', IDEM_KEY:'6B') already exists")
ORA_01400 = 'ORA-01400: cannot insert NULL into ("APP"."IDEM_RECORDS"."IDEM_KEY")'
ORA_02291 = "ORA-02291: integrity constraint (APP.FK_ACCT) violated - parent key not found"
# Adversarial: constraint names are user text, so the message can say anything.
ORA_02291_SAYS_00001 = ('ORA-02291: integrity constraint (APP."ORA-00001: unique constraint violated") violated'
                        " - parent key not found")
ORA_08177 = "ORA-08177: can't serialize access for this transaction"
ORA_00060 = "ORA-00060: deadlock detected while waiting for resource"
ORA_00054 = "ORA-00054: resource busy and acquire with NOWAIT specified or timeout expired"
ORA_30006 = "ORA-30006: resource busy; acquire with WAIT timeout expired"
ORA_03113 = "ORA-03113: end-of-file on communication channel"


class Result:
    def __init__(self, row: Any = None, rowcount: int = 1) -> None:
        self.row, self.rowcount = row, rowcount

    def first(self) -> Any:
        return self.row


class ScriptedConnection:
    """Stands in for a Connection to Oracle: compiles each statement with the real oracledb dialect, records the
    SQL and the driver-level parameters, and answers from a script (a Result, or an exception to raise)."""

    def __init__(self, engine: Engine, script: list[Any], isolation_level: str | None = None) -> None:
        self.dialect = engine.dialect
        self.script = list(script)
        self.statements: list[tuple[str, dict[str, Any]]] = []
        self.options = {"isolation_level": isolation_level} if isolation_level else {}

    def get_execution_options(self) -> dict[str, Any]:
        return self.options

    def execute(self, stmt: Any, params: dict[str, Any] | None = None) -> Result:
        compiled = stmt.compile(dialect=self.dialect)
        self.statements.append((" ".join(str(compiled).split()), bound(compiled, self.dialect, params)))
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        assert isinstance(step, Result)
        return step

    def begin_nested(self) -> Any:
        raise AssertionError("the Oracle claim needs no savepoint")


def winner_row(fp: str, response: Any, status: int = 201) -> SimpleNamespace:
    now = datetime(2026, 1, 1, 12, 0, 0)
    return SimpleNamespace(fingerprint=fp, claim_token="t" * 32, completed_at=now, locked_until=now, db_now=now,
                           status=status, response=encode_response(response))


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
    assert store.backend.name == "oracle" and attempts == []  # building the store did not connect
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
        backend.insert_if_absent(conn, t, values)  # type: ignore[arg-type]
    assert err.value.field == field and conn.statements == []
    messages = build_tables("idem_", backend).messages
    with pytest.raises(InvalidKey):
        backend.insert_if_absent(conn, messages, dict(subscriber="sub", message_id=""))  # type: ignore[arg-type]


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
    assert isinstance(backend.now().type, type(backend.timestamp_type()))


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
        "SELECT idem_records.scope, idem_records.operation, idem_records.idem_key, idem_records.fingerprint,"
        " idem_records.claim_token, idem_records.created_at, idem_records.locked_until, idem_records.completed_at,"
        " idem_records.status, idem_records.response, sys_extract_utc(SYSTIMESTAMP) AS db_now FROM idem_records"
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


def test_serializable_snapshot_hiding_the_winner_is_retryable(engine: Engine) -> None:
    """SERIALIZABLE reads as of the transaction's start: a winner committed later is invisible to the loser.
    The backend raises WinnerNotVisible, which run retries as a serialization failure (like ORA-08177)."""
    store = IdempotencyStore(engine)
    dup = wrapped(ora_error(1, ORA_00001), engine)
    conn = ScriptedConnection(engine, [dup, Result(None)], isolation_level="SERIALIZABLE")
    with pytest.raises(WinnerNotVisible) as err:
        store.claim(conn, scope="s", operation="op", key="k", request=REQ)  # type: ignore[arg-type]
    assert err.value.table == store.tables.records.name
    assert store.retry_cause(err.value) == RetryCause.SERIALIZATION


@pytest.mark.parametrize(("engine_level", "option", "raises"), [
    ("SERIALIZABLE", None, True),  # create_engine(isolation_level="SERIALIZABLE"), as the conformance suite does
    ("SERIALIZABLE", "READ COMMITTED", False),  # a per-connection execution option wins
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
    assert backend.purge_batch(conn, t, condition, 3) == 3  # type: ignore[arg-type]
    [(text, params)] = conn.statements
    assert text == (
        "DELETE FROM idem_records WHERE ROWID IN (SELECT ROWID FROM idem_records"
        " WHERE idem_records.completed_at < sys_extract_utc(SYSTIMESTAMP) + numtodsinterval(:param_1, 'SECOND')"
        " AND ROWNUM <= :param_2)"
        " AND idem_records.completed_at < sys_extract_utc(SYSTIMESTAMP) + numtodsinterval(:param_1, 'SECOND')"
    )
    assert params["param_2"] == 3 and str(params["param_1"]) == "-60.000000"


# --- exact values: keys and empties ------------------------------------------------------------------------------


KEYS = ["k", "K", "k ", " k", "k\t", "Straße", "STRASSE", "é", unicodedata.normalize("NFD", "é"), "🔑" * 255,
        "a" * 255]


def test_keys_round_trip_byte_exact_and_stay_distinct(engine: Engine) -> None:
    """Keys become their UTF-8 bytes: distinct keys (case, accents, normalization, trailing space) stay distinct
    whatever NLS_COMP/NLS_SORT says, and come back as the same str."""
    key = OracleBackend(engine).key_type()
    bind = key.bind_processor(engine.dialect)
    result = key.result_processor(engine.dialect, oracledb.DB_TYPE_RAW)
    assert bind is not None and result is not None
    stored = [bind(k) for k in KEYS]
    assert len(set(stored)) == len(KEYS)
    assert [result(s) for s in stored] == KEYS
    assert max(len(s) for s in stored) == KEY_BYTES  # 255 four-byte characters fill RAW(1020) exactly


@pytest.mark.parametrize("response", ["", b"", None, [], {}, 0, "\x00", b"\x00"], ids=repr)
def test_empty_responses_are_never_empty_bytes(engine: Engine, response: Any) -> None:
    blob = NonEmptyBlob()
    bind = blob.bind_processor(engine.dialect)
    stored = bind(encode_response(response)) if bind else encode_response(response)
    assert stored and decode_response(stored) == response and type(decode_response(stored)) is type(response)


def test_empty_values_are_refused_not_nulled(engine: Engine) -> None:
    """Should anything ever bind '' or b'' to these columns, it fails loudly instead of storing NULL."""
    with pytest.raises(InvalidPayload):
        NonEmptyBlob().process_bind_param(b"", engine.dialect)
    with pytest.raises(InvalidPayload):
        NonEmptyString(64).process_bind_param("", engine.dialect)
    assert NonEmptyBlob().process_bind_param(None, engine.dialect) is None  # response of an open claim
    assert NonEmptyString(64).process_bind_param(None, engine.dialect) is None  # message without payload
    # Fingerprints of empty requests and payloads are 64 hex characters, never ''.
    assert all(len(fp) == 64 for fp in (fingerprint(""), payload_fingerprint(b""), payload_fingerprint("")))


# --- error classification on real oracledb exceptions ------------------------------------------------------------


def test_driver_error_objects_are_the_real_ones() -> None:
    dup = ora_error(1, ORA_00001)
    assert type(dup) is oracledb.IntegrityError
    [err] = dup.args
    assert type(err) is ora_errors._Error
    assert (err.code, err.full_code) == (1, "ORA-00001")
    assert type(ora_error(8177, ORA_08177)) is oracledb.DatabaseError
    assert type(ora_error(2291, ORA_02291)) is oracledb.IntegrityError


@pytest.mark.parametrize(("code", "message", "sa_class", "duplicate", "cause"), [
    (1, ORA_00001, sa_exc.IntegrityError, True, None),
    (1400, ORA_01400, sa_exc.IntegrityError, False, None),
    (2291, ORA_02291, sa_exc.IntegrityError, False, None),
    (2291, ORA_02291_SAYS_00001, sa_exc.IntegrityError, False, None),
    (8177, ORA_08177, sa_exc.DatabaseError, False, RetryCause.SERIALIZATION),
    (8177, ORA_08177 + " (not ORA-00060 deadlock, not ORA-00001)", sa_exc.DatabaseError, False,
     RetryCause.SERIALIZATION),
    (60, ORA_00060, sa_exc.DatabaseError, False, RetryCause.DEADLOCK),
    (54, ORA_00054, sa_exc.DatabaseError, False, RetryCause.BUSY),
    (30006, ORA_30006, sa_exc.DatabaseError, False, RetryCause.LOCK_TIMEOUT),
    (3113, ORA_03113, sa_exc.DatabaseError, False, RetryCause.CONNECTION),
    (942, "ORA-00942: table or view does not exist (ORA-08177 ORA-00060)", sa_exc.DatabaseError, False, None),
], ids=["00001", "01400", "02291", "02291-says-00001", "08177", "08177-says-others", "00060", "00054", "30006",
        "03113-lost", "00942-says-retryable"])
def test_classification_by_error_code(
    backend: OracleBackend, engine: Engine, code: int, message: str, sa_class: type, duplicate: bool, cause: str | None
) -> None:
    exc = wrapped(ora_error(code, message), engine)
    assert isinstance(exc, sa_class)
    assert ora_code(exc) == code
    assert backend.is_duplicate(exc) is duplicate
    assert backend.retry_cause(exc) == cause


def test_driver_errors_without_an_ora_number_are_neither(backend: OracleBackend, engine: Engine) -> None:
    """A DPY- (driver) error has code 0: never a duplicate, whatever its text."""
    orig = ora_errors._create_exception(ora_errors.ERR_NOT_CONNECTED)
    assert orig.args[0].code == 0
    exc = wrapped(orig, engine)
    assert not backend.is_duplicate(exc)
    text_only = wrapped(oracledb.IntegrityError("ORA-00001: unique constraint violated"), engine)
    assert ora_code(text_only) is None and not backend.is_duplicate(text_only)
    assert backend.retry_cause(ValueError("ORA-08177")) is None


@pytest.mark.parametrize(("code", "message"), [(1400, ORA_01400), (2291, ORA_02291), (2291, ORA_02291_SAYS_00001)])
def test_insert_lets_other_integrity_errors_through(backend: OracleBackend, engine: Engine, code: int,
                                                    message: str) -> None:
    t = build_tables("idem_", backend).records
    values = dict(scope="s", operation="op", idem_key="k", fingerprint="f" * 64, claim_token="c" * 32)
    conn = ScriptedConnection(engine, [wrapped(ora_error(code, message), engine)])
    with pytest.raises(sa_exc.IntegrityError) as err:
        backend.insert_if_absent(conn, t, values)  # type: ignore[arg-type]
    assert ora_code(err.value) == code


def test_insert_duplicate_returns_false_without_savepoint(backend: OracleBackend, engine: Engine) -> None:
    t = build_tables("idem_", backend).records
    values = dict(scope="s", operation="op", idem_key="k", fingerprint="f" * 64, claim_token="c" * 32)
    conn = ScriptedConnection(engine, [wrapped(ora_error(1, ORA_00001), engine), Result()])
    assert backend.insert_if_absent(conn, t, values) is False  # type: ignore[arg-type]
    assert backend.insert_if_absent(conn, t, values) is True  # type: ignore[arg-type]  # the connection goes on
    assert [s.split()[0] for s, _ in conn.statements] == ["INSERT", "INSERT"]


# --- run's retries with Oracle's classification ------------------------------------------------------------------


@pytest.fixture
def sqlite_store_with_oracle_errors(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, engine: Engine) -> Iterator[Any]:
    """The store's real transaction machinery (on a SQLite file) with the Oracle backend's retry classification,
    to show what `run` does with Oracle's errors: which it retries, and that it rolls back first."""
    store = IdempotencyStore.from_url(f"sqlite+pysqlite:///{tmp_path / 'o.db'}",
                                      retry=RetryPolicy(total=5, initial=0.001, max_wait=0.005))
    monkeypatch.setattr(store.backend, "retry_cause", OracleBackend(engine).retry_cause)
    store.create_tables()
    fx = Table("fx", MetaData(), Column("id", Integer, primary_key=True, autoincrement=True), Column("k", String(20)))
    fx.create(store.engine)
    rollbacks: list[int] = []
    event.listen(store.engine, "rollback", lambda conn: rollbacks.append(1))
    yield SimpleNamespace(store=store, fx=fx, rollbacks=rollbacks)
    store.engine.dispose()


def test_run_rolls_back_and_retries_deadlock(sqlite_store_with_oracle_errors: Any, engine: Engine) -> None:
    """ORA-00060 leaves the transaction open with its locks (only the statement was undone): the failed attempt
    is rolled back explicitly, then run retries in a new transaction."""
    ctx = sqlite_store_with_oracle_errors
    calls: list[int] = []

    def effect(conn: Any) -> str:
        calls.append(1)
        conn.execute(ctx.fx.insert().values(k="k"))
        if len(calls) == 1:
            raise wrapped(ora_error(60, ORA_00060), engine, "UPDATE accounts ...")
        return "done"

    result = ctx.store.run(scope="s", operation="op", key="k", request=REQ, effect=effect)
    assert (result.response, result.replayed) == ("done", False)
    assert len(calls) == 2 and len(ctx.rollbacks) >= 1
    with ctx.store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ctx.fx)).scalar_one() == 1  # attempt 1 undone


def test_run_gives_up_on_persistent_serialization_failures(sqlite_store_with_oracle_errors: Any,
                                                           engine: Engine) -> None:
    ctx = sqlite_store_with_oracle_errors
    ctx.store.retry = RetryPolicy(total=5, initial=0.001, max_wait=0.002, max_attempts=3)

    def effect(conn: Any) -> None:
        raise wrapped(ora_error(8177, ORA_08177), engine, "UPDATE accounts ...")

    with pytest.raises(RetriesExhausted) as err:
        ctx.store.run(scope="s", operation="op", key="k", request=REQ, effect=effect)
    assert err.value.causes == {RetryCause.SERIALIZATION: 3}


@pytest.mark.parametrize(("code", "message"), [(1400, ORA_01400), (2291, ORA_02291_SAYS_00001), (1, ORA_00001)])
def test_run_does_not_retry_integrity_errors(sqlite_store_with_oracle_errors: Any, engine: Engine, code: int,
                                             message: str) -> None:
    """An effect's own integrity error (even a unique violation of its own table) is the caller's, not retried."""
    ctx = sqlite_store_with_oracle_errors
    calls: list[int] = []

    def effect(conn: Any) -> None:
        calls.append(1)
        raise wrapped(ora_error(code, message), engine, "INSERT INTO accounts ...")

    with pytest.raises(sa_exc.IntegrityError):
        ctx.store.run(scope="s", operation="op", key="k", request=REQ, effect=effect)
    assert calls == [1]
