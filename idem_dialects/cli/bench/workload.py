"""The debit workload on one store, with and without idempotency, and the PL/pgSQL reference."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, bindparam, func, select, text
from sqlalchemy.engine import Connection

from ...retry import RetryPolicy, retrying
from ...steps import Flow, Sleep
from ...store import IdempotencyStore
from .plan import INITIAL_BALANCE, OPERATION, REQUEST
from .runner import ExactlyOnceViolation

T = TypeVar("T")


class Workload:
    """The debit workload on one store: an account table, debits of 1, optional PL/pgSQL reference."""

    def __init__(self, store: IdempotencyStore) -> None:
        self.store = store
        self.engine = store.engine
        self.metadata = MetaData()
        self.account = Table(
            f"{store.table_prefix}account",
            self.metadata,
            Column("id", Integer, primary_key=True, autoincrement=False),
            Column("balance", BigInteger, nullable=False),
        )
        a = self.account.c
        self._debit = self.account.update().where(a.id == bindparam("acct")).values(balance=a.balance - 1)
        self._balance = select(a.balance).where(a.id == bindparam("acct"))
        self.pg_schema: str | None = None
        self.retries: Counter[str] = Counter()  # retries of the bare effect (no `run` to count them)
        self._lock = threading.Lock()

    # setup / teardown

    def create(self, accounts: Sequence[int], plpgsql: bool) -> None:
        self.store.create_tables()
        with self.engine.begin() as conn:
            self.metadata.create_all(conn)
            conn.execute(self.account.insert(), [{"id": i, "balance": INITIAL_BALANCE} for i in accounts])
        if plpgsql:
            self.pg_schema = self.store.table_prefix.rstrip("_")
            with self.engine.begin() as conn:
                for statement in plpgsql_ddl(self.pg_schema):
                    conn.exec_driver_sql(statement)
                conn.execute(text(f"INSERT INTO {self.pg_schema}.account VALUES (:id, :balance)"),
                             [{"id": i, "balance": INITIAL_BALANCE} for i in accounts])

    def drop(self) -> None:
        with self.engine.begin() as conn:
            self.metadata.drop_all(conn)
            if self.pg_schema is not None:
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {self.pg_schema} CASCADE")
        self.store.drop_tables()

    # one request of each kind; each returns "applied" or "replayed"

    def debit(self, conn: Connection, acct: int) -> int:
        conn.execute(self._debit, {"acct": acct})
        return int(conn.execute(self._balance, {"acct": acct}).scalar_one())

    def bare(self, acct: int, key: str) -> str:
        """The effect alone, re-run on the engine's retryable errors by the store's own bounded retry."""

        def once() -> str:
            with self.store.transaction() as conn:
                self.debit(conn, acct)
            return "applied"

        return call_with_retry(self.store.retry, self.store.retry_cause, once, self._count_retry)

    def _count_retry(self, cause: str) -> None:
        with self._lock:
            self.retries[cause] += 1

    def via_run(self, acct: int, key: str) -> str:
        result = self.store.run(scope=f"account:{acct}", operation=OPERATION, key=key, request=REQUEST,
                                effect=lambda conn: {"balance": self.debit(conn, acct)})
        return "replayed" if result.replayed else "applied"

    def plpgsql(self, acct: int, key: str) -> str:
        with self.engine.begin() as conn:
            reply = conn.execute(text(f"SELECT {self.pg_schema}.debit_once(:acct, :key, 1)"),
                                 {"acct": acct, "key": key}).scalar_one()
        if not isinstance(reply, dict) or "balance" not in reply:
            raise ExactlyOnceViolation(f"debit_once({acct}, {key!r}) returned {reply!r}")
        return "called"

    # what the database holds

    def balances(self, accounts: Sequence[int], plpgsql: bool = False) -> dict[int, int]:
        with self.engine.connect() as conn:
            if plpgsql:
                rows = conn.execute(text(f"SELECT account_id, balance FROM {self.pg_schema}.account"
                                         " WHERE account_id = ANY(:ids)"), {"ids": list(accounts)}).all()
            else:
                a = self.account.c
                rows = conn.execute(select(a.id, a.balance).where(a.id.in_(accounts))).all()
        return {int(i): INITIAL_BALANCE - int(b) for i, b in rows}

    def records(self, accounts: Sequence[int], plpgsql: bool = False) -> dict[int, tuple[int, int]]:
        """Per account: (records, completed records)."""
        with self.engine.connect() as conn:
            if plpgsql:
                rows = conn.execute(text(f"SELECT account_id, count(*), count(*) FROM {self.pg_schema}.request_result"
                                         " WHERE account_id = ANY(:ids) GROUP BY account_id"),
                                    {"ids": list(accounts)}).all()
                return {int(i): (int(n), int(d)) for i, n, d in rows}
            r = self.store.tables.records.c
            scopes = [f"account:{i}" for i in accounts]
            rows = conn.execute(select(r.scope, func.count(), func.count(r.completed_at))
                                .where(r.scope.in_(scopes)).group_by(r.scope)).all()
        return {int(s.split(":", 1)[1]): (int(n), int(d)) for s, n, d in rows}


def plpgsql_ddl(schema: str) -> list[str]:
    """The reference schema and its debit_once function (the same debit as one PL/pgSQL call), schema-qualified."""
    return [
        f"CREATE SCHEMA {schema}",
        f"""CREATE TABLE {schema}.account (
    account_id bigint PRIMARY KEY,
    balance bigint NOT NULL CHECK (balance >= 0))""",
        f"""CREATE TABLE {schema}.request_result (
    account_id bigint NOT NULL REFERENCES {schema}.account (account_id),
    operation text COLLATE "C" NOT NULL,
    request_key text COLLATE "C" NOT NULL,
    request jsonb NOT NULL,
    response jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT request_result_pkey PRIMARY KEY (account_id, operation, request_key))""",
        f"""CREATE FUNCTION {schema}.debit_once(p_account bigint, p_key text, p_amount bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    supplied jsonb := jsonb_build_object('amount', p_amount);
    saved_request jsonb;
    reply jsonb;
    remaining bigint;
BEGIN
    IF p_key IS NULL OR p_key = '' OR p_amount IS NULL OR p_amount <= 0 THEN
        RAISE EXCEPTION 'key and positive amount required' USING ERRCODE = '22023';
    END IF;
    INSERT INTO {schema}.request_result (account_id, operation, request_key, request, response)
    VALUES (p_account, 'debit:v1', p_key, supplied, '{{}}'::jsonb)
    ON CONFLICT (account_id, operation, request_key) DO NOTHING;
    IF NOT FOUND THEN
        SELECT request, response INTO STRICT saved_request, reply
        FROM {schema}.request_result
        WHERE account_id = p_account AND operation = 'debit:v1' AND request_key = p_key;
        IF saved_request IS DISTINCT FROM supplied THEN
            RAISE EXCEPTION 'idempotency key reused with different request' USING ERRCODE = '22023';
        END IF;
        RETURN reply;
    END IF;
    UPDATE {schema}.account SET balance = balance - p_amount
    WHERE account_id = p_account AND balance >= p_amount
    RETURNING balance INTO remaining;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'insufficient balance' USING ERRCODE = 'P0001';
    END IF;
    reply := jsonb_build_object('balance', remaining);
    UPDATE {schema}.request_result SET response = reply
    WHERE account_id = p_account AND operation = 'debit:v1' AND request_key = p_key;
    RETURN reply;
END;
$$""",
    ]


def call_with_retry(
    policy: RetryPolicy,
    classify: Callable[[BaseException], str | None],
    fn: Callable[[], T],
    on_retry: Callable[[str], None] = lambda cause: None,
) -> T:
    """`retrying` for a plain function, sleeping with `time.sleep`: the bare effect, retried as `run` retries."""

    def attempt() -> Flow[T]:
        return fn()
        yield  # a generator: the call above is the attempt

    flow = retrying(policy, classify, attempt, on_retry)
    sent: Any = None
    while True:
        try:
            step = flow.send(sent)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        assert isinstance(step, Sleep)
        time.sleep(step.seconds)
