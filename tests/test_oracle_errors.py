"""Oracle without a server, continued: exact values (keys, empty strings and blobs), error classification on the
exception objects python-oracledb itself raises, and run's retries under that classification.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from offline_common import run
from ora_common import *  # noqa: F403  (fixtures: backend, engine)
from ora_common import (
    ORA_00001,
    ORA_00054,
    ORA_00060,
    ORA_01400,
    ORA_02291,
    ORA_02291_SAYS_00001,
    ORA_03113,
    ORA_08177,
    ORA_30006,
    REQ,
    Result,
    ScriptedConnection,
    ora_error,
    ora_errors,
    oracledb,
    wrapped,
)
from sqlalchemy import Column, Integer, MetaData, String, Table, event, func, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from idem_dialects import IdempotencyStore, InvalidPayload, RetriesExhausted, RetryPolicy
from idem_dialects.dialects.oracle import (
    KEY_BYTES,
    NonEmptyBlob,
    NonEmptyString,
    OracleBackend,
)
from idem_dialects.dialects.oracle_errors import ora_code
from idem_dialects.errors import RetryCause
from idem_dialects.fingerprint import decode_response, encode_response, fingerprint, payload_fingerprint
from idem_dialects.schema import build_tables

# --- exact values: keys and empties ------------------------------------------------------------------------------


KEYS = ["k", "K", "k ", " k", "k\t", "Straße", "STRASSE", "é", unicodedata.normalize("NFD", "é"), "🔑" * 255,
        "a" * 255]


def test_keys_round_trip_byte_exact_and_stay_distinct(engine: Engine) -> None:
    """Keys become their UTF-8 bytes: distinct keys (case, accents, normalization, trailing space) stay distinct
    whatever NLS_COMP/NLS_SORT says, and come back as the same str."""
    key = OracleBackend(engine).columns.key
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
    assert backend.errors.is_duplicate(exc) is duplicate
    assert backend.errors.retry_cause(exc) == cause


def test_driver_errors_without_an_ora_number_are_neither(backend: OracleBackend, engine: Engine) -> None:
    """A DPY- (driver) error has code 0: never a duplicate, whatever its text."""
    orig = ora_errors._create_exception(ora_errors.ERR_NOT_CONNECTED)
    assert orig.args[0].code == 0
    exc = wrapped(orig, engine)
    assert not backend.errors.is_duplicate(exc)
    text_only = wrapped(oracledb.IntegrityError("ORA-00001: unique constraint violated"), engine)
    assert ora_code(text_only) is None and not backend.errors.is_duplicate(text_only)
    assert backend.errors.retry_cause(ValueError("ORA-08177")) is None


@pytest.mark.parametrize(("code", "message"), [(1400, ORA_01400), (2291, ORA_02291), (2291, ORA_02291_SAYS_00001)])
def test_insert_lets_other_integrity_errors_through(backend: OracleBackend, engine: Engine, code: int,
                                                    message: str) -> None:
    t = build_tables("idem_", backend).records
    values = dict(scope="s", operation="op", idem_key="k", fingerprint="f" * 64, claim_token="c" * 32)
    conn = ScriptedConnection(engine, [wrapped(ora_error(code, message), engine)])
    with pytest.raises(sa_exc.IntegrityError) as err:
        run(backend.insert_if_absent(t, values), conn)
    assert ora_code(err.value) == code


def test_insert_duplicate_returns_false_without_savepoint(backend: OracleBackend, engine: Engine) -> None:
    t = build_tables("idem_", backend).records
    values = dict(scope="s", operation="op", idem_key="k", fingerprint="f" * 64, claim_token="c" * 32)
    conn = ScriptedConnection(engine, [wrapped(ora_error(1, ORA_00001), engine), Result()])
    assert run(backend.insert_if_absent(t, values), conn) is False
    assert run(backend.insert_if_absent(t, values), conn) is True  # the connection goes on
    assert [s.split()[0] for s, _ in conn.statements] == ["INSERT", "INSERT"]


# --- run's retries with Oracle's classification ------------------------------------------------------------------


@pytest.fixture
def sqlite_store_with_oracle_errors(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, engine: Engine) -> Iterator[Any]:
    """The store's real transaction machinery (on a SQLite file) with the Oracle backend's retry classification,
    to show what `run` does with Oracle's errors: which it retries, and that it rolls back first."""
    store = IdempotencyStore.from_url(f"sqlite+pysqlite:///{tmp_path / 'o.db'}",
                                      retry=RetryPolicy(total=5, initial=0.001, max_wait=0.005))
    monkeypatch.setattr(store.backend.errors, "retry_cause", OracleBackend(engine).errors.retry_cause)
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
