"""The one debit workload every benchmark runs (the sync store, the async store, the HTTP middleware): the account
table and its debit (accounts.py), what the database shows after (units debited per account, records per scope),
and the PL/pgSQL reference. Exactly-once is `exactly_once` over what the database shows, never over what the bench
counted.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import func, select, text
from sqlalchemy.engine import Connection

from idem_dialects.conformance.once import Tally, tally
from idem_dialects.retry import RetryPolicy, retrying
from idem_dialects.schema import Tables
from idem_dialects.steps import Flow, Sleep
from idem_dialects.store import IdempotencyStore

from .accounts import INITIAL_BALANCE, OPERATION, REQUEST, Accounts, scope
from .runner import ExactlyOnceViolation

T = TypeVar("T")
K = TypeVar("K")


def exactly_once(what: str, ran: Mapping[K, int], expected: Mapping[K, int] | int) -> Tally:
    """The conformance suite's exactly-once tally of what the database shows; ExactlyOnceViolation unless it holds."""
    counted = tally(ran, expected)
    if not counted.ok:
        raise ExactlyOnceViolation(f"{what}: {counted}")
    return counted


def records(conn: Connection, tables: Tables, scopes: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Per scope: a store's idempotency records (`tables`), and the completed ones."""
    r = tables.records.c
    rows = conn.execute(select(r.scope, func.count(), func.count(r.completed_at)).where(r.scope.in_(scopes))
                        .group_by(r.scope)).all()
    return {str(s): int(n) for s, n, _ in rows}, {str(s): int(d) for s, _, d in rows}


class Workload:
    """The debit workload on one sync store: the bare effect, through `run`, and the PL/pgSQL reference."""

    def __init__(self, store: IdempotencyStore) -> None:
        self.store = store
        self.engine = store.engine
        self.accounts = Accounts(store.table_prefix)
        self.pg_schema: str | None = None
        self.retries: Counter[str] = Counter()  # retries of the bare effect (no `run` to count them)
        self._lock = threading.Lock()

    def on(self, store: IdempotencyStore) -> Workload:
        """The same workload (its tables, its PL/pgSQL schema) sent through another store on the same tables."""
        twin = Workload(store)
        twin.pg_schema = self.pg_schema
        return twin

    # setup / teardown

    def create(self, accounts: Sequence[int], plpgsql: bool) -> None:
        self.store.create_tables()
        with self.engine.begin() as conn:
            self.accounts.create(conn, accounts)
        if plpgsql:
            self.pg_schema = self.store.table_prefix.rstrip("_")
            with self.engine.begin() as conn:
                for statement in plpgsql_ddl(self.pg_schema):
                    conn.exec_driver_sql(statement)
                conn.execute(text(f"INSERT INTO {self.pg_schema}.account VALUES (:id, :balance)"),
                             [{"id": i, "balance": INITIAL_BALANCE} for i in accounts])

    def drop(self) -> None:
        with self.engine.begin() as conn:
            self.accounts.drop(conn)
            if self.pg_schema is not None:
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {self.pg_schema} CASCADE")
        self.store.drop_tables()

    # one request of each kind; each returns "applied" or "replayed"

    def bare(self, acct: int, key: str) -> str:
        """The effect alone, re-run on the engine's retryable errors by the store's own bounded retry."""

        def once() -> str:
            with self.store.transaction() as conn:
                self.accounts.apply(conn, acct)
            return "applied"

        return call_with_retry(self.store.retry, self.store.retry_cause, once, self._count_retry)

    def _count_retry(self, cause: str) -> None:
        with self._lock:
            self.retries[cause] += 1

    def via_run(self, acct: int, key: str) -> str:
        result = self.store.run(scope=scope(acct), operation=OPERATION, key=key, request=REQUEST,
                                effect=lambda conn: {"balance": self.accounts.apply(conn, acct)})
        return "replayed" if result.replayed else "applied"

    def plpgsql(self, acct: int, key: str) -> str:
        with self.engine.begin() as conn:
            reply = conn.execute(text(f"SELECT {self.pg_schema}.debit_once(:acct, :key, 1)"),
                                 {"acct": acct, "key": key}).scalar_one()
        if not isinstance(reply, dict) or "balance" not in reply:
            raise ExactlyOnceViolation(f"debit_once({acct}, {key!r}) returned {reply!r}")
        return "called"

    # what the database holds

    def debits(self, accounts: Sequence[int], plpgsql: bool = False) -> dict[int, int]:
        """Per account: the units debited (through the store's table, or the PL/pgSQL reference's)."""
        with self.engine.connect() as conn:
            if not plpgsql:
                return self.accounts.debits(conn, accounts)
            rows = conn.execute(text(f"SELECT account_id, balance FROM {self.pg_schema}.account"
                                     " WHERE account_id = ANY(:ids)"), {"ids": list(accounts)}).all()
        return {int(i): INITIAL_BALANCE - int(b) for i, b in rows}

    def records(self, accounts: Sequence[int], plpgsql: bool = False) -> tuple[dict[int, int], dict[int, int]]:
        """Per account: the records, and the completed ones (the reference's rows are complete when written)."""
        with self.engine.connect() as conn:
            if plpgsql:
                rows = conn.execute(text(f"SELECT account_id, count(*) FROM {self.pg_schema}.request_result"
                                         " WHERE account_id = ANY(:ids) GROUP BY account_id"),
                                    {"ids": list(accounts)}).all()
                found = {int(i): int(n) for i, n in rows}
                return found, found
            total, done = records(conn, self.store.tables, [scope(a) for a in accounts])
        return ({int(s.split(":", 1)[1]): n for s, n in total.items()},
                {int(s.split(":", 1)[1]): n for s, n in done.items()})


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
