"""PostgreSQL: the reference backend (psycopg 3 via ``postgresql+psycopg://``; psycopg2, pg8000 and asyncpg work).

The claim is one ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` in a CTE that also returns the existing row, so a
replay is one statement; ON CONFLICT never raises for its arbiter index, so the caller's transaction stays usable.
Under READ COMMITTED that statement's snapshot can predate a winner it waited for, so only then a separate read
follows; under REPEATABLE READ and SERIALIZABLE PostgreSQL raises 40001 instead, which `run` retries. No session
state is kept, so a transaction-mode pooler works: declared by ``?pooler=transaction``, or found by the first
connection (`pooler.py`: drivers' prepared statements go off; docs: engines/postgresql).
on_in_flight="conflict" claims under a transaction-local lock_timeout of 1 ms (0 would mean none), put back after
the claim statement or undone by a failed claim's rollback: no session state, so poolers still work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from importlib.util import find_spec
from typing import Any

from sqlalchemy import (
    DateTime,
    Interval,
    LargeBinary,
    String,
    any_,
    bindparam,
    delete,
    exists,
    false,
    func,
    literal,
    literal_column,
    null,
    select,
    text,
    true,
    type_coerce,
    union_all,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table
from sqlalchemy.sql.selectable import CompoundSelect

from ..drivers import asyncpg, pg8000, psycopg, psycopg2
from ..features import Features
from ..keys import MAX_LENGTH
from ..steps import Begin, Flow, Shape, execute, rowcount
from . import options
from .base import Backend, Columns, insert_values, key_is, params, replay_columns, statement
from .postgresql_errors import PostgreSQLErrors
from .postgresql_maintenance import PostgreSQLMaintenance

# The claim's lock wait, refused (on_in_flight="conflict"): the old value read and the new one set in one round trip
# (a SELECT's target list is evaluated left to right); 1 ms, as 0 would mean no limit at all.
_NOWAIT_ON = select(func.current_setting("lock_timeout"), func.set_config("lock_timeout", "1ms", true()))
_NOWAIT_OFF = select(func.set_config("lock_timeout", bindparam("old_lock_timeout"), true()))
# A purge batch reads the first rows of an index range and stops: planned as a bitmap scan (or a sort over one) it
# would read the whole range first, every batch again, and that is how a prepared statement's generic plan (the
# range's edges unknown) or a table never analysed (a bulk load, autovacuum behind) gets planned: 43 ms for a batch's
# edge over 200,000 records, against 0.2 ms on the index in its order. Off for the batch's transaction only (SET LOCAL).
_PURGE_PLANNING = select(func.set_config("enable_bitmapscan", "off", true()),
                         func.set_config("enable_seqscan", "off", true()))
_SYNCHRONOUS = ("on", "remote_write", "remote_apply")  # synchronous_commit levels that wait for the standby
_STANDBY = text("SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit')")
# A btree index row holds at most 2704 bytes (8 kB pages): an 8-byte tuple header plus, per key column, a 4-byte
# varlena header and up to 3 bytes of alignment; 2704 - 8 - 3 x 7 = 2675 bytes of identity always fit (measured:
# a 2680-byte identity can fail with "index row size 2712 exceeds btree version 4 maximum 2704").
BTREE_IDENTITY_BYTES = 2675
# The server reads a protocol message of at most MaxAllocSize - 1 bytes (PQ_LARGE_MESSAGE_LIMIT, 1 GiB - 2; beyond,
# "invalid message length" and it closes the connection: a lost connection to the client, which `run` would retry)
# and a bytea value of at most MaxAllocSize (1 GiB - 1) with its 4-byte header. psycopg and asyncpg send bytes as
# they are (binary format), psycopg2 and pg8000 as hex text (twice the length): see each driver's `sent_size`.
MESSAGE_LIMIT = 0x3FFFFFFF - 1


class PostgreSQLBackend(Backend):
    name = "postgresql"
    drivers = (asyncpg.DRIVER, psycopg.DRIVER, psycopg2.DRIVER, pg8000.DRIVER)
    classifier = PostgreSQLErrors
    maintainer = PostgreSQLMaintenance
    base_features = Features(max_identity_bytes=BTREE_IDENTITY_BYTES, max_statement_bytes=MESSAGE_LIMIT,
                             statement_limit=f"PostgreSQL's largest message and value, {MESSAGE_LIMIT:,} bytes")
    aliases = ("postgres", "pg", "pgsql", "psql")
    url_options = frozenset({options.FAILOVER_WINDOW, options.POOLER, options.PURGE})
    several_hosts = ("?host=HOST1:PORT1&host=HOST2:PORT2 after an empty host part, e.g."
                     " postgresql+psycopg://USER@/DB?host=h1:5432&host=h2:5432&target_session_attrs=read-write")
    # COLLATE "C" is deterministic and compares bytes, whatever the database default (an ICU locale such as
    # und-u-ks-level2 orders case-insensitively); it also keeps the primary key a plain byte-order btree. Claim
    # tokens are compared in SQL (the fence): byte-exact too. timestamptz: an instant, whatever the session's
    # TimeZone; bytea: NUL bytes and any length round-trip exactly.
    columns = Columns(key=String(MAX_LENGTH, collation="C"), token=String(64, collation="C"),
                      timestamp=DateTime(timezone=True), blob=LargeBinary())

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

    def refine_features(self, features: Features) -> Flow[Features]:
        refined = yield from super().refine_features(features)
        # Acknowledged only once a standby has the commit: what lets a promoted standby keep every acknowledged key.
        names, level = yield from execute(self.prepared("standby", lambda: statement(_STANDBY, Shape.ROW)))
        return refined.replace(synchronous_standby=bool(str(names).strip()) and str(level) in _SYNCHRONOUS)

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

    def insert_if_absent(self, table: Table, values: Mapping[str, Any],
                         clock: Mapping[str, float] | None = None) -> Flow[bool]:
        """``INSERT ... ON CONFLICT (<pk columns>) DO NOTHING RETURNING <first pk column>``: the conflict target
        names the primary key, so only a duplicate identity is absorbed (a violation of any other unique index still
        raises); a row comes back iff this statement inserted it."""
        pk = list(table.primary_key.columns)
        stmt = self.prepared(("insert", table, tuple(values), tuple(sorted((clock or {}).items()))), lambda: (
            statement(pg_insert(table).values(**insert_values(self, table, values, clock))
                           .on_conflict_do_nothing(index_elements=[c.name for c in pk]).returning(pk[0]),
                           Shape.ROW, table)))
        return (yield from execute(stmt, params(values))) is not None

    def claim(self, table: Table, values: Mapping[str, Any], clock: Mapping[str, float], key: Mapping[str, str],
              fresh: bool) -> Flow[tuple[bool, Any]]:
        """``WITH ins AS (INSERT ... ON CONFLICT DO NOTHING RETURNING ...) SELECT <inserted> FROM ins UNION ALL
        SELECT <row> FROM t WHERE <pk> AND NOT EXISTS (SELECT FROM ins)``: the claim, or the winner, in one round
        trip. Neither branch returns a row when the winner committed after this statement's snapshot (see the
        module docstring): then a separate read, with a snapshot of its own, finds it."""
        stmt = self.prepared(("claim", table, tuple(values), tuple(sorted(clock.items())), tuple(key)),
                             lambda: statement(self._claim_statement(table, values, clock, key), Shape.ROW,
                                                    table))
        row = yield from execute(stmt, params(values) | params(key, "k_"))
        if row is None:
            return False, (yield from self.read(table, key))
        return (True, None) if row.inserted else (False, row)

    def _claim_statement(self, table: Table, values: Mapping[str, Any], clock: Mapping[str, float],
                         key: Iterable[str]) -> CompoundSelect[Any]:
        pk = list(table.primary_key.columns)
        ins = (pg_insert(table).values(**insert_values(self, table, values, clock))
               .on_conflict_do_nothing(index_elements=[c.name for c in pk]).returning(pk[0]).cte("ins"))
        # The inserted branch returns only the flag: a first-time request needs nothing of the row.
        wanted = replay_columns(table, key)
        claimed = select(true().label("inserted"), *(type_coerce(null(), c.type).label(c.name) for c in wanted),
                         type_coerce(null(), DateTime(timezone=True)).label("db_now")).select_from(ins)
        existing = select(false().label("inserted"), *wanted, self.now().label("db_now")).where(
            *key_is(table, key), ~exists(select(literal_column("1")).select_from(ins)))
        return union_all(claimed, existing)

    def not_waiting(self, table: Table, key: Mapping[str, str], claim: Flow[Any]) -> Flow[Any]:
        on = self.prepared("nowait on", lambda: statement(_NOWAIT_ON, Shape.ROW))
        off = self.prepared("nowait off", lambda: statement(_NOWAIT_OFF, Shape.NOTHING))
        old = yield from execute(on)
        result = yield from claim  # on an error the transaction is aborted: its rollback restores it (SET LOCAL)
        yield from execute(off, {"old_lock_timeout": old[0]})
        return result

    def begin(self, begin: Begin) -> Flow[None]:
        if begin is Begin.PURGE:
            yield from execute(self.prepared("purge planning", lambda: statement(_PURGE_PLANNING, Shape.ROW)))

    def purge_batch(self, table: Table, condition: ColumnElement[bool], limit: int,
                    values: Mapping[str, Any] | None = None) -> Flow[int]:
        """``DELETE ... WHERE ctid = ANY(ARRAY(SELECT ctid ... LIMIT n FOR UPDATE SKIP LOCKED)) AND <condition>``.

        The inner SELECT locks its batch, re-checking `condition` against the latest row version (READ
        COMMITTED), and skips rows another transaction holds: a claim being taken over or completed right now
        is not waited for and not deleted. Uncommitted claims are invisible, and the condition itself excludes
        live leases. ctid = ANY(ARRAY(...)) plans as a TID scan, so a batch costs its own size.
        """
        def build() -> Any:
            ctid: ColumnElement[Any] = literal_column("ctid")
            batch = (select(ctid).select_from(table).where(condition).limit(limit).with_for_update(skip_locked=True)
                     .correlate(None)  # the batch reads the table itself, not the DELETE's row
                     .scalar_subquery())
            return statement(delete(table).where(ctid == any_(func.array(batch)), condition), Shape.ROWCOUNT,
                                  table)

        url = getattr(self.engine, "url", None)
        if url is not None and options.choice(url, options.PURGE, self.url_options) == "portable":
            return (yield from super().purge_batch(table, condition, limit, values))  # Citus: no multi-shard ctid
        return (yield from rowcount(self.prepared(("purge", table, condition, limit), build), values))

    # --- operations ------------------------------------------------------------------------------------------

