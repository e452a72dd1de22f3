"""PostgreSQL specifics, on PostgreSQL 18 (embedded) and the machine's server (15 in CI).

What the shared conformance suite cannot say engine-neutrally: the exact claim statement, key columns that stay
byte-exact under an ICU default locale and a nondeterministic collation a naive schema would pick up, SQLSTATE
classification, and what each isolation level gives the step-by-step API (the right outcome, or 40001 that `run`
retries). Races are ordered by watching pg_blocking_pids, never by sleeping and hoping.

Isolation levels and retryable errors that really happen: tests/test_postgresql_concurrency.py.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from pg_common import *  # noqa: F403  (fixtures: admin, effects, make_store, pg, store)
from pg_common import REQ
from sqlalchemy import create_engine, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.schema import CreateTable

from idem_dialects import Claimed, IdempotencyStore, Replayed, RequestMismatch
from idem_dialects.conformance.support import Effects, StatementLog
from idem_dialects.dialects.postgresql import PostgreSQLBackend
from idem_dialects.dialects.postgresql_errors import sqlstate
from idem_dialects.engines import Server
from idem_dialects.errors import RetryCause
from idem_dialects.schema import build_tables

# --- the statements ----------------------------------------------------------------------------------------------


def _tables() -> Any:
    return build_tables("idem_", PostgreSQLBackend(create_engine("postgresql+psycopg://u@localhost/db")))


def test_claim_statement_names_its_conflict_target() -> None:
    """The claim compiles to INSERT ... ON CONFLICT (scope, operation, idem_key) DO NOTHING RETURNING: the
    conflict target is the record's key, so no other unique index's violation is ever absorbed."""
    backend = PostgreSQLBackend(create_engine("postgresql+psycopg://u@localhost/db"))
    tables = build_tables("idem_", backend)
    values = dict(scope="s", operation="op", idem_key="k", fingerprint="f", claim_token="t")
    clock = {"created_at": 0.0, "locked_until": 30.0}
    stmt = _first_statement(backend.insert_if_absent(tables.records, values, clock))
    sql = " ".join(str(stmt.compile(dialect=postgresql.dialect())).split())
    assert "ON CONFLICT (scope, operation, idem_key) DO NOTHING RETURNING" in sql
    assert sql.startswith("INSERT INTO idem_records ")
    assert "statement_timestamp()" in sql and "%(v_idem_key)s" in sql  # the DB clock; the key as a bind parameter
    msg = _first_statement(backend.insert_if_absent(tables.messages, dict(subscriber="s", message_id="m"),
                                                    {"processed_at": 0.0}))
    assert "ON CONFLICT (subscriber, message_id) DO NOTHING RETURNING" in str(msg.compile(dialect=postgresql.dialect()))


def _first_statement(flow: Any) -> Any:
    """The clause of the first statement a backend's flow yields (its SQL, compiled without running it)."""
    step = next(flow)
    flow.close()
    return step.statement.clause


def test_ddl_is_byte_exact_and_timezone_aware() -> None:
    """Identity and token columns are COLLATE "C" (bytewise, deterministic), times are timestamptz, responses bytea."""
    ddl = " ".join(str(CreateTable(_tables().records).compile(dialect=postgresql.dialect())).split())
    for column in ("scope", "operation", "idem_key"):
        assert f'{column} VARCHAR(255) COLLATE "C" NOT NULL' in ddl
    assert 'claim_token VARCHAR(64) COLLATE "C" NOT NULL' in ddl
    assert "locked_until TIMESTAMP WITH TIME ZONE NOT NULL" in ddl
    assert "response BYTEA" in ddl
    messages = " ".join(str(CreateTable(_tables().messages).compile(dialect=postgresql.dialect())).split())
    assert 'subscriber VARCHAR(255) COLLATE "C" NOT NULL' in messages
    assert 'message_id VARCHAR(255) COLLATE "C" NOT NULL' in messages


def test_losing_claim_is_one_statement(store: IdempotencyStore) -> None:
    """A losing claim whose winner is visible runs exactly one statement: the ON CONFLICT insert in a CTE whose
    other branch returns the committed winner. (The separate read, for a winner committed after the statement's
    snapshot, is proven by test_claim_waiting_on_uncommitted_winner under READ COMMITTED.)"""
    store.run(scope="s", operation="op", key="k", request=REQ, effect=lambda conn: "first")
    log = StatementLog()
    observed = IdempotencyStore(store.engine, table_prefix=store.table_prefix, statement_hook=log)
    with observed.transaction():
        pass  # a store's first transaction reads the server's settings once
    log.sql.clear()
    with observed.transaction() as conn:
        outcome = observed.claim(conn, scope="s", operation="op", key="k", request=REQ)
    statements = [" ".join(sql.split()) for sql in log.sql]
    assert isinstance(outcome, Replayed) and outcome.response == "first"
    assert len(statements) == 1, statements
    assert statements[0].startswith("WITH ins AS (INSERT ")
    assert "ON CONFLICT (scope, operation, idem_key) DO NOTHING RETURNING" in statements[0]
    assert "UNION ALL SELECT" in statements[0] and "NOT (EXISTS (SELECT 1 FROM ins))" in statements[0]


# --- error classification ------------------------------------------------------------------------------------------


class _Psycopg3Error(Exception):
    def __init__(self, code: str | None, message: str) -> None:
        super().__init__(message)
        self.sqlstate = code


class _Psycopg2Error(Exception):
    def __init__(self, code: str | None, message: str) -> None:
        super().__init__(message)
        self.pgcode = code


def _wrapped(orig: Exception, cls: type[DBAPIError] = OperationalError) -> DBAPIError:
    return cls("SELECT 1", {}, orig)


@pytest.mark.parametrize("driver", [_Psycopg3Error, _Psycopg2Error], ids=["psycopg", "psycopg2"])
@pytest.mark.parametrize(("code", "message", "duplicate", "cause"), [
    ("23505", "could not serialize access; deadlock detected", True, None),
    ("23502", "duplicate key value violates unique constraint", False, None),  # NOT NULL, whatever the text says
    ("23503", "duplicate key", False, None),  # FK
    ("23514", "duplicate key", False, None),  # CHECK
    ("23P01", "conflicting key value violates exclusion constraint", False, None),
    ("40001", "duplicate key", False, RetryCause.SERIALIZATION),
    ("40P01", "anything", False, RetryCause.DEADLOCK),
    ("55P03", "anything", False, RetryCause.LOCK_TIMEOUT),
    ("57P01", "terminating connection due to administrator command", False, RetryCause.CONNECTION),
    ("08006", "connection failure", False, RetryCause.CONNECTION),
    ("08003", "connection does not exist", False, RetryCause.CONNECTION),
    # A protocol statement cancelled by statement_timeout is contention (the effect's own are never retried).
    ("57014", "canceling statement due to statement timeout", False, RetryCause.CANCELLED),
    ("25006", "cannot execute INSERT in a read-only transaction", False, RetryCause.CONNECT),  # a standby
    ("42601", "deadlock detected (a syntax error's text)", False, None),
])
def test_errors_classified_by_sqlstate(driver: type[Exception], code: str, message: str, duplicate: bool,
                                       cause: str | None) -> None:
    """Duplicate and retry causes come from the SQLSTATE (psycopg 3 `sqlstate`, psycopg2 `pgcode`), never the text."""
    backend = PostgreSQLBackend(create_engine("postgresql+psycopg://u@localhost/db"))
    exc = _wrapped(driver(code, message), IntegrityError if code.startswith("23") else OperationalError)
    assert backend.errors.is_duplicate(exc) is duplicate
    assert backend.errors.retry_cause(exc) == cause
    assert backend.errors.retry_cause(driver(code, message)) == cause  # a driver error that SQLAlchemy did not wrap


def test_error_without_sqlstate_is_not_retried_unless_connection_dropped() -> None:
    """An error with no SQLSTATE is retried only when SQLAlchemy saw the connection drop (it invalidated it)."""
    backend = PostgreSQLBackend(create_engine("postgresql+psycopg://u@localhost/db"))
    plain = _wrapped(_Psycopg3Error(None, "server closed the connection unexpectedly"))
    assert sqlstate(plain) is None and backend.errors.retry_cause(plain) is None
    dropped = OperationalError("SELECT 1", {}, _Psycopg3Error(None, "x"), connection_invalidated=True)
    assert backend.errors.retry_cause(dropped) == RetryCause.CONNECTION
    pg8000_style = _wrapped(Exception({"C": "40001", "M": "could not serialize"}))
    assert backend.errors.retry_cause(pg8000_style) == RetryCause.SERIALIZATION


def test_effect_unique_violation_surfaces_unretried(store: IdempotencyStore, effects: Effects) -> None:
    """A unique violation raised by the caller's own effect (another table) reaches the caller as that error: not
    taken for a duplicate claim, not retried, and its claim rolls back with it."""
    store.run(scope="s", operation="op", key="k1", request=REQ,
              effect=lambda conn: effects.apply(conn, "k1", ref="order-7"))
    attempts: list[int] = []

    def reuse_ref(conn: Connection) -> Any:
        attempts.append(1)
        return effects.apply(conn, "k2", ref="order-7")

    with pytest.raises(IntegrityError) as err:
        store.run(scope="s", operation="op", key="k2", request=REQ, effect=reuse_ref)
    assert sqlstate(err.value) == "23505" and "fx" in str(err.value)
    assert attempts == [1] and not store.retries
    with store.engine.connect() as conn:
        keys = [r.idem_key for r in conn.execute(select(store.tables.records))]
    assert keys == ["k1"]
    # The same in the step-by-step API: the claim holds, the effect's violation propagates out of the transaction.
    with pytest.raises(IntegrityError), store.transaction() as conn:
        assert isinstance(store.claim(conn, scope="s", operation="op", key="k3", request=REQ), Claimed)
        effects.apply(conn, "k3", ref="order-7")
    fixed = store.run(scope="s", operation="op", key="k2", request=REQ, effect=effects.effect("k2"))
    assert not fixed.replayed and effects.per_key() == {"k1": 1, "k2": 1}


# --- clock, purge, exact bytes -------------------------------------------------------------------------------------


def test_lease_starts_at_claim_statement_not_transaction_start(store: IdempotencyStore) -> None:
    """A lease is measured from the claim statement (statement_timestamp), not the transaction's start: a claim
    made late in a transaction still gets its whole lease. Times are timestamptz (aware datetimes)."""
    with store.transaction() as conn:
        conn.execute(text("SELECT pg_sleep(0.3)"))
        outcome = store.claim(conn, scope="s", operation="op", key="k", request=REQ, lease=timedelta(seconds=1))
        assert isinstance(outcome, Claimed)
        t = store.tables.records
        row = conn.execute(select(t.c.created_at, t.c.locked_until,
                                  text("transaction_timestamp() AS tx_start"))).one()
    assert row.created_at.tzinfo is not None
    assert row.locked_until - row.created_at == timedelta(seconds=1)
    assert row.locked_until - row.tx_start >= timedelta(seconds=1.3)


def test_purge_skips_rows_others_hold(store: IdempotencyStore, admin: Engine) -> None:
    """purge never waits for or deletes a row another transaction holds (FOR UPDATE SKIP LOCKED), nor sees an
    uncommitted claim; it takes the held row once released."""
    for key in ("held", "free"):
        store.run(scope="s", operation="op", key=key, request=REQ, effect=lambda conn, k=key: k)
    t = store.tables.records
    with store.engine.connect() as holder, store.engine.connect() as claimer, ThreadPoolExecutor(1) as pool:
        holder_tx = holder.begin()
        holder.execute(select(t).where(t.c.idem_key == "held").with_for_update()).one()
        claimer_tx = claimer.begin()
        assert isinstance(store.claim(claimer, scope="s", operation="op", key="new", request=REQ), Claimed)
        try:
            assert pool.submit(store.purge, timedelta(0), 10).result(timeout=20) == 1
        finally:
            holder_tx.rollback()
        claimer_tx.rollback()
    with store.engine.connect() as conn:
        assert [r.idem_key for r in conn.execute(select(t.c.idem_key))] == ["held"]
    assert store.purge(timedelta(0), 10) == 1


def test_nul_characters_round_trip(store: IdempotencyStore) -> None:
    """Requests, responses and message payloads containing NUL round-trip exactly (fingerprints and bytea; PostgreSQL
    text cannot hold NUL, and none is stored as text)."""
    req = {"memo": "a\x00b", "raw": "\x00"}
    first = store.run(scope="s", operation="op", key="k", request=req, effect=lambda conn: {"echo": "x\x00y"})
    again = store.run(scope="s", operation="op", key="k", request={"raw": "\x00", "memo": "a\x00b"},
                      effect=lambda conn: "never")
    assert again.replayed and again.response == first.response == {"echo": "x\x00y"}
    with pytest.raises(RequestMismatch):
        store.run(scope="s", operation="op", key="k", request={"memo": "a\x00c", "raw": "\x00"},
                  effect=lambda conn: "never")
    with store.transaction() as conn:
        assert store.accept_message(conn, subscriber="sub", message_id="m", payload={"t": "\x00"})
    with pytest.raises(RequestMismatch), store.transaction() as conn:
        store.accept_message(conn, subscriber="sub", message_id="m", payload={"t": "\x00\x00"})


def test_server_version(pg: Server, admin: Engine) -> None:
    """The embedded engine is PostgreSQL 18; the service is whatever the machine runs (15 in CI)."""
    with admin.connect() as conn:
        version = int(conn.execute(text("SHOW server_version_num")).scalar_one())
    if pg.engine == "postgresql-18":
        assert 180000 <= version < 190000
    assert version >= 130000


# --- collations ----------------------------------------------------------------------------------------------------

# Keys that a case-insensitive, normalization-insensitive comparison would merge; each must be its own record.
CONFUSABLE_KEYS = ["Key", "key", "KEY", "caf\u00e9", "cafe\u0301", "CAF\u00c9", "k", "k "]


@pytest.fixture(params=["icu", "builtin"])
def odd_default_database(request: pytest.FixtureRequest, pg: Server, admin: Engine) -> Iterator[URL]:
    """A new database whose default collation is not C. With ICU: `und-u-ks-level2` (case-insensitive strength)
    as the database default, plus a nondeterministic copy of it shadowing `text` through the search_path.
    Without ICU (the embedded 18 wheel is built without it) there is no nondeterministic collation to pick up;
    the builtin provider's Unicode locale (PostgreSQL 17+) is the non-C default tried instead."""
    name = f"idem_coll_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        version = int(conn.execute(text("SHOW server_version_num")).scalar_one())
        if request.param == "icu":
            locale = "LOCALE_PROVIDER icu ICU_LOCALE 'und-u-ks-level2'"
        else:
            if version < 170000:
                pytest.skip("the builtin locale provider needs PostgreSQL 17+ (here the ICU variant runs)")
            locale = "LOCALE_PROVIDER builtin BUILTIN_LOCALE " + ("'PG_UNICODE_FAST'" if version >= 180000
                                                                   else "'C.UTF-8'")
        try:
            conn.execute(text(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' {locale}"))
        except DBAPIError as exc:
            if sqlstate(exc) == "0A000":  # feature_not_supported: "ICU is not supported in this build"
                pytest.skip(f"{pg.engine}: {str(exc.orig).strip()} (no ICU: no nondeterministic collations exist)")
            if sqlstate(exc) == "42501":
                pytest.skip(f"{pg.engine}: no privilege to create a database")
            raise
        if request.param == "icu":
            conn.execute(text(f"ALTER DATABASE {name} SET search_path = public, pg_catalog"))
    url = pg.url.set(database=name)
    if request.param == "icu":
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("CREATE COLLATION case_insensitive "
                              "(provider = icu, locale = 'und-u-ks-level2', deterministic = false)"))
            conn.execute(text("CREATE DOMAIN public.text AS pg_catalog.text COLLATE case_insensitive"))
        engine.dispose()
    try:
        yield url
    finally:
        with admin.connect() as conn:
            force = " WITH (FORCE)" if version >= 130000 else ""
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}{force}"))


def test_keys_byte_exact_under_non_c_default_collation(odd_default_database: URL,
                                                       make_store: Callable[..., IdempotencyStore]) -> None:
    """Keys differing only in case, Unicode normalization form or trailing space stay distinct records in a
    database whose default collation is a case-insensitive ICU locale.

    PostgreSQL refuses a nondeterministic collation as a database default (CREATE DATABASE has no DETERMINISTIC
    option; the default collation breaks ties bytewise, so 'a' = 'A' is false there even though ORDER BY ignores
    case). The strongest realistic equivalent is tested instead: that ICU default, plus a nondeterministic
    case-insensitive collation a naive schema picks up without naming it - a `text` domain shadowing
    pg_catalog.text through the database's search_path. A naive table keyed on `text` merges these keys (asserted,
    so the probe has teeth); our tables, keyed on VARCHAR COLLATE "C", do not."""
    url = odd_default_database
    engine = create_engine(url)
    with engine.begin() as conn:
        if conn.execute(text("SELECT count(*) FROM pg_collation WHERE collname = 'case_insensitive'")).scalar():
            conn.execute(text("CREATE TABLE naive (k text PRIMARY KEY)"))
            for key in CONFUSABLE_KEYS:
                conn.execute(text("INSERT INTO naive VALUES (:k) ON CONFLICT DO NOTHING"), {"k": key})
            merged = conn.execute(text("SELECT count(*) FROM naive")).scalar_one()
            assert merged < len(CONFUSABLE_KEYS) - 3, "the naive schema should have merged case/normalization twins"
        assert conn.execute(text("SELECT 'a' = 'A'")).scalar() is False  # the database default stays deterministic
    engine.dispose()

    store = make_store(url)
    for key in CONFUSABLE_KEYS:
        result = store.run(scope="Tenant", operation="op", key=key, request=REQ, effect=lambda conn, k=key: k)
        assert not result.replayed and result.response == key
    for scope in ("tenant", "TENANT"):
        other = store.run(scope=scope, operation="op", key="Key", request=REQ, effect=lambda conn, s=scope: s)
        assert not other.replayed
    for key in CONFUSABLE_KEYS:
        again = store.run(scope="Tenant", operation="op", key=key, request=REQ, effect=lambda conn: "never")
        assert again.replayed and again.response == key
    with store.transaction() as conn:
        for key in CONFUSABLE_KEYS:
            assert store.accept_message(conn, subscriber="sub", message_id=key)
    with store.engine.connect() as conn:
        collations = conn.execute(text(
            "SELECT a.attname, c.collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation"
            " WHERE a.attrelid = CAST(:t AS regclass) AND a.attname IN ('scope', 'operation', 'idem_key')"
        ), {"t": store.tables.records.name}).all()
        assert sorted(collations) == [("idem_key", "C"), ("operation", "C"), ("scope", "C")]
        assert len(conn.execute(select(store.tables.records)).all()) == len(CONFUSABLE_KEYS) + 2


def test_case_twins_race_exactly_once_each(effects: Effects) -> None:
    """16 threads on two keys differing only in case: each key gets exactly one effect (no cross-key replay)."""
    store = effects.store
    barrier = threading.Barrier(16)

    def call(i: int) -> Any:
        key = "Race" if i % 2 else "race"
        barrier.wait()
        return store.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key))

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(16)))
    assert effects.per_key() == {"Race": 1, "race": 1}
    assert sum(not r.replayed for r in results) == 2
