"""PostgreSQL: the reference backend (psycopg 3 via ``postgresql+psycopg://``; psycopg2 works the same).

The claim is one ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` in a CTE that also returns the existing row, so a
replay is one statement; ON CONFLICT never raises for its arbiter index, so the caller's transaction stays usable.
Under READ COMMITTED that statement's snapshot can predate a winner it waited for, so only then a separate read
follows; under REPEATABLE READ and SERIALIZABLE PostgreSQL raises 40001 instead, which `run` retries. No session
state is kept, so a transaction-mode pooler works once the URL says ``?pooler=transaction`` (docs: engines/postgresql).
on_in_flight="conflict" claims under a transaction-local lock_timeout of 1 ms (0 would mean none), put back after
the claim statement or undone by a failed claim's rollback: no session state, so poolers still work.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from importlib.util import find_spec
from typing import Any

from sqlalchemy import (
    DateTime,
    Engine,
    Interval,
    LargeBinary,
    String,
    any_,
    bindparam,
    delete,
    event,
    exists,
    false,
    func,
    literal,
    literal_column,
    null,
    select,
    true,
    type_coerce,
    union_all,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL, Connection, ExceptionContext
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.dml import Delete, ReturningInsert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table
from sqlalchemy.sql.selectable import CompoundSelect
from sqlalchemy.types import TypeEngine

from ..errors import CannotConnect, ConnectionConfigError, IdemError, RetryCause
from ..features import Features
from ..guard import MISSING_TABLE, NO_PRIVILEGE
from ..keys import MAX_LENGTH
from . import options
from .base import AnyRow, Backend, replay_columns
from .drivers import Driver
from .network import socket_problem
from .postgresql_startup import startup_sqlstate

# SQLSTATEs (Appendix A of the PostgreSQL manual); classification never looks at message text.
UNIQUE_VIOLATION = "23505"
UNDEFINED_TABLE = "42P01"
# A concurrent CREATE TABLE of one name: 42P07 if the other committed first, else a unique violation in the catalog
# (pg_type's row for the table's composite type) once it does; 42710 for a constraint or index name.
LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout expired (or NOWAIT)
# The claim's lock wait, refused (on_in_flight="conflict"): the old value read and the new one set in one round trip
# (a SELECT's target list is evaluated left to right); 1 ms, as 0 would mean no limit at all.
_NOWAIT_ON = select(func.current_setting("lock_timeout"), func.set_config("lock_timeout", "1ms", true()))
_NOWAIT_OFF = select(func.set_config("lock_timeout", bindparam("old_lock_timeout"), true()))
_ALREADY_CREATED = frozenset({"42P07", "42710", UNIQUE_VIOLATION})
INSUFFICIENT_PRIVILEGE = "42501"
# The DETAIL PostgreSQL adds to NOT NULL / CHECK / partition violations repeats the whole row (responses, tokens).
_FAILING_ROW = re.compile(r"\n?DETAIL:\s+Failing row contains .*", re.S)
_RETRYABLE = {
    "40001": RetryCause.SERIALIZATION,  # serialization_failure (RR/SERIALIZABLE snapshot conflicts, SSI)
    "40P01": RetryCause.DEADLOCK,  # deadlock_detected: this transaction was chosen as the victim and rolled back
    "55P03": RetryCause.LOCK_TIMEOUT,  # lock_not_available: lock_timeout expired or NOWAIT
    "57P01": RetryCause.CONNECTION,  # admin_shutdown: pg_terminate_backend, fast shutdown
    "57P02": RetryCause.CONNECTION,  # crash_shutdown
    "57P03": RetryCause.CONNECTION,  # cannot_connect_now: server starting up or in recovery
    "57014": RetryCause.CANCELLED,  # query_canceled: statement_timeout (never retried for the effect's statements)
    # read_only_sql_transaction: the server reached is a read-only standby (after a failover); nothing was written,
    # and a new connection (target_session_attrs=read-write) finds the new primary.
    "25006": RetryCause.CONNECT,
}
# Opening a connection: what only a changed configuration fixes (by SQLSTATE, or its class), and the classes a
# retry may outlast (08 connection exception, 53 insufficient resources: too many clients, 57 operator intervention:
# starting up, shutting down).
_CONNECT_CONFIG = {
    "28": ("authentication failed for user {user!r}",
           "check the user and password in the URL (and the server's pg_hba.conf)"),
    "3D000": ("the database {database!r} does not exist", "check the URL's database name or create it"),
    "42501": ("user {user!r} may not connect to database {database!r}",
              "GRANT CONNECT ON DATABASE to it, or use another user"),
}
_CONNECT_TRANSIENT_CLASSES = frozenset({"08", "53", "57"})
_LIBPQ_DRIVERS = frozenset({"psycopg", "psycopg2"})  # drivers whose connect errors come from libpq (no SQLSTATE)
_SYNCHRONOUS = ("on", "remote_write", "remote_apply")  # synchronous_commit levels that wait for the standby
_CONNECTION_CLASS = "08"  # connection_exception and its subclasses
# A btree index row holds at most 2704 bytes (8 kB pages): an 8-byte tuple header plus, per key column, a 4-byte
# varlena header and up to 3 bytes of alignment; 2704 - 8 - 3 x 7 = 2675 bytes of identity always fit (measured:
# a 2680-byte identity can fail with "index row size 2712 exceeds btree version 4 maximum 2704").
BTREE_IDENTITY_BYTES = 2675


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, wrapped by SQLAlchemy or not: psycopg 3 ``sqlstate``, psycopg2 ``pgcode``,
    pg8000 the ``C`` field of its error dict. None when the error did not come from the server."""
    orig: Any = exc.orig if isinstance(exc, DBAPIError) else exc
    for attr in ("sqlstate", "pgcode"):
        code = getattr(orig, attr, None)
        if isinstance(code, str) and code:
            return code
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], dict):
        code = args[0].get("C")
        if isinstance(code, str) and code:
            return code
    return None


def _pg8000_integrity_errors(context: ExceptionContext) -> BaseException | None:
    """pg8000 raises ProgrammingError for every server error but 23505 (and 28000), so a NOT NULL, CHECK or foreign
    key violation would not be an IntegrityError as PEP 249 and every other driver have it: re-raise SQLSTATE class
    23 (integrity_constraint_violation) as SQLAlchemy's IntegrityError, same driver error, same message."""
    exc = context.sqlalchemy_exception
    if (isinstance(exc, DBAPIError) and exc.orig is not None and not isinstance(exc, IntegrityError)
            and (sqlstate(exc) or "").startswith("23")):
        return IntegrityError(exc.statement, exc.params, exc.orig, hide_parameters=exc.hide_parameters,
                              connection_invalidated=exc.connection_invalidated)
    return None


_PSYCOPG_BEGIN = "psycopg sends BEGIN before a transaction's first statement (one more round trip)"


def _unnamed_statement() -> str:
    """The statement name SQLAlchemy's asyncpg dialect prepares under: '' is PostgreSQL's unnamed statement, which
    asyncpg (its cache off) parses again with every execution, so nothing is left on any server session."""
    return ""


class PostgreSQLBackend(Backend):
    name = "postgresql"
    base_features = Features(max_identity_bytes=BTREE_IDENTITY_BYTES)
    aliases = ("postgres", "pg", "pgsql", "psql")
    extra = "postgresql"
    drivers = (
        # SQLAlchemy's asyncpg adapter starts an asyncpg Transaction: BEGIN on the wire.
        Driver("asyncpg", "asyncpg", "idem-dialects[async]", sync=False, asynchronous=True,
               implicit_begin="asyncpg sends BEGIN when a transaction starts (one more round trip)"),
        # psycopg 3 serves both; create_async_engine picks its async mode.
        # psycopg 3 takes autocommit when connecting (sync and async); psycopg2 and pg8000 only as an attribute.
        Driver("psycopg", "psycopg", "idem-dialects[postgresql]", asynchronous=True, implicit_begin=_PSYCOPG_BEGIN,
               autocommit_args={"autocommit": True}),
        Driver("psycopg2", "psycopg2", "psycopg2-binary", implicit_begin=_PSYCOPG_BEGIN),
        # pg8000 1.31: close() after a lost connection fails writing Terminate and never closes its socket file.
        Driver("pg8000", "pg8000", "pg8000", leaks_lost_sockets=True),
    )
    url_options = frozenset({options.FAILOVER_WINDOW, options.POOLER})
    plpgsql_baseline = True
    replay_cpu_target_ms = 0.7
    provision = "idem_dialects.dialects.postgresql_provision:PostgreSQLProvision"

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        if isinstance(engine, Engine) and engine.dialect.driver == "pg8000" and not event.contains(
                engine, "handle_error", _pg8000_integrity_errors):
            event.listen(engine, "handle_error", _pg8000_integrity_errors)

    @classmethod
    def resolve_url(cls, url: URL) -> URL:
        # A bare postgresql:// means psycopg2 to SQLAlchemy; the [postgresql] extra installs psycopg 3 instead.
        if url.drivername == "postgresql" and find_spec("psycopg2") is None and find_spec("psycopg") is not None:
            url = url.set(drivername="postgresql+psycopg")
        # Multi-host (failover) URLs: SQLAlchemy understands ?host=a:p1&host=b:p2 and ?host=a,b&port=p1,p2, but
        # passes ?host=a:p1,b:p2 to libpq as port=',' (every connection fails). Rewrite it to the first form.
        host = url.query.get("host")
        if isinstance(host, str) and "," in host and ":" in host and "port" not in url.query:
            url = url.update_query_pairs([("host", h.strip()) for h in host.split(",") if h.strip()])
        return url

    @classmethod
    def url_features(cls, url: URL) -> Features:
        features = super().url_features(url)
        if options.choice(url, options.POOLER, cls.url_options) == "transaction":
            return features.replace(session_state=False)
        return features

    def connect_params(self, params: dict[str, Any]) -> None:
        if self.features.session_state:
            return
        # Behind a transaction-mode pooler a prepared statement would be sent to a server session that never
        # prepared it (or prepared another under its name): no driver may prepare across transactions.
        driver = self.engine.dialect.driver
        if driver in ("psycopg", "psycopg_async"):
            params["prepare_threshold"] = None  # psycopg 3: never prepare (default: after 5 executions)
        elif driver == "asyncpg":
            # asyncpg's own statement cache off; SQLAlchemy's dialect prepares every statement itself: no cache
            # there either, and the unnamed statement, which lives only until the next one.
            params["statement_cache_size"] = 0
            params["prepared_statement_cache_size"] = 0
            params["prepared_statement_name_func"] = _unnamed_statement

    def refine_features(self, conn: Connection, features: Features) -> Features:
        refined = super().refine_features(conn, features)
        began = not conn.in_transaction()
        # Acknowledged only once a standby has the commit: what lets a promoted standby keep every acknowledged key.
        names, level = conn.exec_driver_sql(
            "SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit')").one()
        if began:  # end the transaction this read autobegan: the caller begins its own
            conn.rollback()
        return refined.replace(synchronous_standby=bool(str(names).strip()) and str(level) in _SYNCHRONOUS)

    # --- column types ----------------------------------------------------------------------------------------

    def key_type(self) -> TypeEngine[str]:
        # COLLATE "C" is deterministic and compares bytes, whatever the database default (an ICU locale such as
        # und-u-ks-level2 orders case-insensitively); it also keeps the primary key a plain byte-order btree.
        return String(MAX_LENGTH, collation="C")

    def token_type(self) -> TypeEngine[str]:
        # Claim tokens are compared in SQL (the fence); keep them byte-exact too.
        return String(64, collation="C")

    def timestamp_type(self) -> TypeEngine[datetime]:
        return DateTime(timezone=True)  # timestamptz: an instant, whatever the session's TimeZone

    def blob_type(self) -> TypeEngine[bytes]:
        return LargeBinary()  # bytea: NUL bytes and any length round-trip exactly

    # --- the clock -------------------------------------------------------------------------------------------

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        # statement_timestamp(): when the current statement began. Not now()/transaction_timestamp(), which is
        # the transaction's start: a claim made late in a long transaction would get a lease already partly
        # spent, and a read of `db_now` there would misjudge whether a lease is over. Not clock_timestamp(),
        # which moves during a statement: created_at/locked_until (or completed_at/locked_until) written by one
        # statement should be one instant, and purge should judge every row of a batch against one cutoff.
        # (A statement's start precedes any lock wait inside it; a claim only waits on another claim's short
        # transaction, and the read that judges leases is a statement of its own, so its `db_now` is fresh.)
        expr: ColumnElement[Any] = func.statement_timestamp()
        if seconds:
            expr = expr + literal(timedelta(seconds=seconds), Interval())
        return type_coerce(expr, DateTime(timezone=True))

    # --- the protocol's statements ---------------------------------------------------------------------------

    def insert_statement(
        self, table: Table, values: Mapping[str, Any], clock: Mapping[str, float] | None = None
    ) -> ReturningInsert[Any]:
        """``INSERT ... ON CONFLICT (<pk columns>) DO NOTHING RETURNING <first pk column>``.

        The conflict target names the primary key, so only a duplicate identity is absorbed; a violation of any
        other unique index on the table still raises. A row comes back iff this statement inserted it.
        """
        pk = list(table.primary_key.columns)
        return self.prepared_insert(table, values, clock, lambda v: (
            pg_insert(table).values(**v).on_conflict_do_nothing(index_elements=[c.name for c in pk]).returning(pk[0])
        ))

    def insert_if_absent(
        self, conn: Connection, table: Table, values: Mapping[str, Any], clock: Mapping[str, float] | None = None
    ) -> bool:
        stmt = self.insert_statement(table, values, clock)
        return conn.execute(stmt, self.params(values)).first() is not None

    def claim_or_read(
        self, conn: Connection, table: Table, values: Mapping[str, Any], clock: Mapping[str, float],
        key: Mapping[str, str],
    ) -> tuple[bool, AnyRow | None]:
        """``WITH ins AS (INSERT ... ON CONFLICT DO NOTHING RETURNING ...) SELECT <inserted> FROM ins UNION ALL
        SELECT <row> FROM t WHERE <pk> AND NOT EXISTS (SELECT FROM ins)``: the claim, or the winner, in one round
        trip. Neither branch returns a row when the winner committed after this statement's snapshot (see the
        module docstring): then a separate read, with a snapshot of its own, finds it."""
        stmt = self.prepared(("claim or read", table, tuple(values), tuple(sorted(clock.items())), tuple(key)),
                             lambda: self._claim_or_read_statement(table, values, clock, key))
        row = conn.execute(stmt, self.params(values) | self.params(key, "k_")).first()
        if row is None:
            return False, self.read_row(conn, table, key)
        return (True, None) if row.inserted else (False, row)

    def _claim_or_read_statement(
        self, table: Table, values: Mapping[str, Any], clock: Mapping[str, float], key: Iterable[str]
    ) -> CompoundSelect[Any]:
        pk = list(table.primary_key.columns)
        ins = (pg_insert(table).values(**self.insert_values(table, values, clock))
               .on_conflict_do_nothing(index_elements=[c.name for c in pk]).returning(pk[0]).cte("ins"))
        # The inserted branch returns only the flag: a first-time request needs nothing of the row.
        wanted = replay_columns(table, key)
        claimed = select(true().label("inserted"), *(type_coerce(null(), c.type).label(c.name) for c in wanted),
                         type_coerce(null(), DateTime(timezone=True)).label("db_now")).select_from(ins)
        where = [table.c[name] == bind for name, bind in self.binds(table, key, "k_").items()]
        existing = select(false().label("inserted"), *wanted, self.now().label("db_now")).where(
            *where, ~exists(select(literal_column("1")).select_from(ins)))
        return union_all(claimed, existing)

    def purge_statement(self, table: Table, condition: ColumnElement[bool], limit: int) -> Delete:
        """``DELETE ... WHERE ctid = ANY(ARRAY(SELECT ctid ... LIMIT n FOR UPDATE SKIP LOCKED)) AND <condition>``.

        The inner SELECT locks its batch, re-checking `condition` against the latest row version (READ
        COMMITTED), and skips rows another transaction holds: a claim being taken over or completed right now
        is not waited for and not deleted. Uncommitted claims are invisible, and the condition itself excludes
        live leases. ctid = ANY(ARRAY(...)) plans as a TID scan, so a batch costs its own size.
        """
        ctid: ColumnElement[Any] = literal_column("ctid")
        batch = (
            select(ctid)
            .select_from(table)
            .where(condition)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .correlate(None)  # the batch reads the table itself, not the DELETE's row
            .scalar_subquery()
        )
        return delete(table).where(ctid == any_(func.array(batch)), condition)

    def purge_batch(self, conn: Connection, table: Table, condition: ColumnElement[bool], limit: int) -> int:
        return conn.execute(self.purge_statement(table, condition, limit)).rowcount

    # --- operations ------------------------------------------------------------------------------------------

    def size_statement(self, table: Table) -> Executable:
        # pg_table_size counts the heap, TOAST (large responses) and the free space and visibility maps.
        relation = func.to_regclass(literal(self.engine.dialect.identifier_preparer.format_table(table)))
        return select(func.pg_table_size(relation), func.pg_indexes_size(relation))

    # --- error classification --------------------------------------------------------------------------------

    def is_duplicate(self, exc: DBAPIError) -> bool:
        return sqlstate(exc) == UNIQUE_VIOLATION

    def is_already_created(self, exc: DBAPIError) -> bool:
        return sqlstate(exc) in _ALREADY_CREATED

    @contextmanager
    def not_waiting(self, conn: Connection, table: Table, key: Mapping[str, str]) -> Iterator[None]:
        row = conn.execute(_NOWAIT_ON).first()
        assert row is not None
        yield  # on an error the transaction is aborted: its rollback restores the setting (SET LOCAL)
        conn.execute(_NOWAIT_OFF, {"old_lock_timeout": row[0]})

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        return sqlstate(exc) == LOCK_NOT_AVAILABLE


    def config_problem(self, exc: DBAPIError, context: ExceptionContext, tables: Sequence[str]) -> str | None:
        return {UNDEFINED_TABLE: MISSING_TABLE, INSUFFICIENT_PRIVILEGE: NO_PRIVILEGE}.get(sqlstate(exc) or "")

    def redact(self, exc: DBAPIError) -> None:
        # psycopg and psycopg2 put DETAIL in their message; pg8000 keeps it under "D" in its error dict.
        orig: Any = exc.orig
        for error in (orig, exc):
            args = getattr(error, "args", ())
            if args and isinstance(args[0], str) and _FAILING_ROW.search(args[0]):
                error.args = (_FAILING_ROW.sub("\nDETAIL:  (row redacted by idem-dialects)", args[0]), *args[1:])
            elif args and isinstance(args[0], dict) and str(args[0].get("D", "")).startswith("Failing row"):
                error.args = ({k: v for k, v in args[0].items() if k != "D"}, *args[1:])

    def connect_error(self, exc: BaseException) -> IdemError | None:
        orig: Any = exc.orig if isinstance(exc, DBAPIError) else exc
        # psycopg 3 knows without a SQLSTATE that the server asked for a password and none was given.
        pgconn = getattr(orig, "pgconn", None)
        if getattr(pgconn, "needs_password", False) and not getattr(pgconn, "used_password", True):
            return ConnectionConfigError(self.name, "the server asks for a password and none was given",
                                         "put the password in the URL (postgresql+psycopg://USER:PASSWORD@HOST/DB)"
                                         " or in ~/.pgpass")
        code = sqlstate(exc)
        if code is None and type(orig).__module__.partition(".")[0] in _LIBPQ_DRIVERS:
            # libpq drops the SQLSTATE of a refused startup (wrong database, too many clients, starting up): ask
            # the server the same question once more, by protocol, and read its answer's code.
            probe = startup_sqlstate(self.engine.url)
            if isinstance(probe, OSError):
                return socket_problem(self.name, probe) if isinstance(probe, socket.gaierror) else CannotConnect(
                    self.name, exc)
            code = probe
        if code is not None:
            config = _CONNECT_CONFIG.get(code) or _CONNECT_CONFIG.get(code[:2])
            if config is not None:
                what = config[0].format(user=self.engine.url.username, database=self.engine.url.database)
                return ConnectionConfigError(self.name, f"{what} (SQLSTATE {code})", config[1])
            if code[:2] in _CONNECT_TRANSIENT_CLASSES or code in _RETRYABLE:
                return CannotConnect(self.name, exc)
        return super().connect_error(exc)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        code = sqlstate(exc)
        if code is not None:
            if code in _RETRYABLE:
                return _RETRYABLE[code]
            if code.startswith(_CONNECTION_CLASS):
                return RetryCause.CONNECTION
        return super().retry_cause(exc)  # a connection SQLAlchemy saw drop (no SQLSTATE: the socket closed)
