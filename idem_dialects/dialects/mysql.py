"""MySQL 8.4 and MariaDB (InnoDB): byte-exact keys, a claim that reports a duplicate without raising where the server
has RETURNING (MariaDB), else duplicates by error 1062 and a locking read for the loser.

Why it looks like this (the engine page of the docs has the whole story): collations merge keys (even
``utf8mb4_bin`` is PAD SPACE), so identities are VARBINARY UTF-8; REPEATABLE READ snapshots hide the winner, so the
loser reads the latest committed version (a current read). On MariaDB the claim is ``INSERT ... ON DUPLICATE KEY
UPDATE <key> = <key> RETURNING <winner>``: one statement, no 1062 through the driver and SQLAlchemy, no second read.
INSERT IGNORE was measured and not taken (it downgrades truncation and NOT NULL errors to warnings, and asyncmy
fetches and logs every warning, the duplicate's key included). On MySQL (no RETURNING) the claim is a plain INSERT
whose 1062 is confirmed against the primary key. The two engines differ only where this module says so (RETURNING,
locking read syntax, MariaDB's extra retryable 1020); Galera nodes are detected from the live server.
on_in_flight="conflict" claims with the session's innodb_lock_wait_timeout at 0 (MySQL's floor is 1 s), put back
after the claim statement: InnoDB has no NOWAIT for a duplicate INSERT's wait.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from importlib.util import find_spec
from typing import Any, ClassVar, NamedTuple

from sqlalchemy import (
    Engine,
    Insert,
    UniqueConstraint,
    and_,
    case,
    event,
    func,
    literal,
    literal_column,
    null,
    select,
    text,
    type_coerce,
)
from sqlalchemy.dialects.mysql import DATETIME, LONGBLOB, VARBINARY, VARCHAR
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.mysql import limit as mysql_limit
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table

from ..drivers import asyncmy, mariadbconnector, mysqlconnector, mysqldb, pymysql
from ..features import Features
from ..keys import MAX_LENGTH
from ..steps import Begin, Flow, Shape, execute, rowcount
from . import options
from .base import Backend, Columns, binds, insert_values, key_is, params, replay_columns, statement
from .mysql_errors import MariaDBErrors, MySQLErrors
from .mysql_maintenance import MySQLMaintenance
from .mysql_pool import _COMMITTED_CLEAN, _reset_unless_clean, resets_by_hook
from .types import Utf8Bytes

KEY_BYTES = MAX_LENGTH * 4  # UTF-8 needs at most 4 bytes per character
_UTC_NOW: ColumnElement[Any] = literal_column("UTC_TIMESTAMP(6)")  # the DB clock, independent of the session time zone
# The claim's lock wait, refused (on_in_flight="conflict"): the session's value saved in a user variable, then back.
_NOWAIT_ON = text("SET @idem_lock_wait = @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = 0")
_NOWAIT_OFF = text("SET SESSION innodb_lock_wait_timeout = @idem_lock_wait")
# SHOW: MySQL has no wsrep_on, MariaDB without Galera says OFF. max_allowed_packet (the session's, fixed when it
# connected) bounds one statement: a larger one fails with 1153 or, mid-send, drops the connection. Each new session's
# is read again (`session_setup`).
_SERVER_FACTS = text("SHOW VARIABLES WHERE Variable_name IN ('wsrep_on', 'max_allowed_packet')")
_STRICT_MODES = frozenset({"STRICT_ALL_TABLES", "STRICT_TRANS_TABLES"})
# Galera's wsrep_sync_wait bits: 1 reads (and BEGIN), 2 UPDATE/DELETE, 4 INSERT/REPLACE. A node applies other
# nodes' write sets asynchronously; with these bits a statement first waits until this node has applied every
# write set committed anywhere before it began, so a claim never misses a record acknowledged on another node
# (without bit 4 the INSERT succeeds locally, the effect callable runs, and only certification stops it).
GALERA_SYNC_WAIT = 1 | 2 | 4
_SEP = b"|"  # between the fields of a claim's packed winner (`_winner`)


def _primary_key_is_only_unique_key(table: Table) -> bool:
    """Then any 1062 on `table` is a duplicate primary key (true of the record tables this library creates)."""
    return not any(isinstance(c, UniqueConstraint) for c in table.constraints) and not any(
        index.unique for index in table.indexes)


class Winner(NamedTuple):
    """The record a claim lost to, as `Backend.claim` answers it."""

    fingerprint: str
    claim_token: str
    locked_until: datetime
    completed_at: datetime | None
    status: int | None
    response: bytes | None
    db_now: datetime


def _returning(backend: Backend) -> bool:
    """Whether `backend`'s server has INSERT ... RETURNING (known once its features are refined)."""
    features = backend.features
    return isinstance(features, MySQLFeatures) and features.insert_returning


def _claim_statement(backend: Backend, table: Table, values: Mapping[str, Any], clock: Mapping[str, float]) -> Insert:
    """``INSERT ... ON DUPLICATE KEY UPDATE <key> = <key> RETURNING <winner>``. The no-op update changes no row
    (InnoDB skips it; a Galera node replicates nothing for it) but is a current read under an exclusive lock: it
    waits for an uncommitted winner as a failed INSERT does, sees the latest committed version whatever the
    snapshot, and holds the lock to the end of the transaction (concurrent replays of one key take turns; see
    `not_waiting`). The RETURNING value is NULL when the row is ours (this request's claim token, not complete:
    just inserted, or a leased claim of ours that committed), else the winner's columns packed in one value for
    `_winner`: one column description for the driver to parse instead of seven. No other error is silenced: strict
    sql_mode still refuses NOT NULL and over-long values, and the caller checks that the primary key is the only
    unique key (ON DUPLICATE KEY fires on any)."""
    c = table.c
    ours = and_(c.claim_token == binds(table, ("claim_token",))["claim_token"], c.completed_at.is_(None))
    pk = table.primary_key.columns[0]
    return (mysql_insert(table).values(**insert_values(backend, table, values, clock))
            .on_duplicate_key_update({pk.name: pk})
            .returning(type_coerce(case((ours, null()), else_=_packed(table)), LONGBLOB()).label("winner")))


def _packed(table: Table) -> ColumnElement[Any]:
    """The record's columns a loser needs, and the database's clock, as one binary value (see `_winner`)."""
    c = table.c
    empty: ColumnElement[Any] = literal_column("''")
    fields = (c.fingerprint, c.claim_token, c.locked_until, func.ifnull(c.completed_at, empty), _UTC_NOW,
              func.ifnull(c.status, empty), func.ifnull(c.response, empty))
    sep: ColumnElement[Any] = literal_column(f"'{_SEP.decode()}'")
    return type_coerce(func.concat(*[part for f in fields for part in (f, sep)][:-1]), LONGBLOB())


def _winner(packed: bytes) -> Winner:
    """The winner from `_claim_statement`'s value: six ASCII fields (hex, DATETIME(6) text, digits; none holds the
    separator), then the stored response's exact bytes. An empty completed_at is NULL, and so then is the response
    (a completed record's response is never NULL, and may be empty)."""
    fingerprint, token, locked, completed, now, status, response = bytes(packed).split(_SEP, 6)
    return Winner(fingerprint.decode(), token.decode(), datetime.fromisoformat(locked.decode()),
                  datetime.fromisoformat(completed.decode()) if completed else None,
                  int(status) if status else None, response if completed else None,
                  datetime.fromisoformat(now.decode()))


def _completed(backend: Backend, table: Table, key: Mapping[str, str]) -> Flow[Winner | None]:
    """The record of `key` if it is complete, by a consistent read that waits for no lock (a completed record
    stays complete); None if absent, in flight, or locked from this read too (SERIALIZABLE reads lock)."""
    stmt = backend.prepared(("completed", table, tuple(key)), lambda: statement(
        select(_packed(table).label("winner")).where(*key_is(table, key)), Shape.ROW, table))
    try:
        row = yield from execute(stmt, params(key, "k_"))
    except DBAPIError as exc:
        if backend.errors.is_lock_busy(exc):
            return None
        raise
    winner = None if row is None else _winner(row.winner)
    return winner if winner is not None and winner.completed_at is not None else None


@dataclass(frozen=True, slots=True)
class MySQLFeatures(Features):
    # The server's spelling of a shared locking read: FOR SHARE (MySQL 8.0.1+) or LOCK IN SHARE MODE (MariaDB,
    # older MySQL; a mysql:// URL may reach either, so the live server decides).
    share_lock: str = "FOR SHARE"
    # A Galera node (wsrep_on): claims certify at commit, so two nodes can both hold a claim until one commits.
    wsrep: bool = False
    # FOR UPDATE SKIP LOCKED: MySQL 8.0.1+, MariaDB 10.6+. Older servers' relays take turns (FOR UPDATE waits).
    skip_locked: bool = True
    # INSERT ... RETURNING (MariaDB 10.5+; the live server decides): the claim answers with the winner itself.
    insert_returning: bool = False


def _with_packet(features: Features, packet: int) -> Features:
    """`features` whose statement limit is `packet` (a session's max_allowed_packet), unless it is lower already."""
    known = features.max_statement_bytes
    if known is not None and known <= packet:
        return features
    return features.replace(max_statement_bytes=packet,
                            statement_limit=f"the server's max_allowed_packet, {packet:,} bytes")


class MySQLBackend(Backend):
    name = "mysql"
    drivers = (pymysql.DRIVER, asyncmy.DRIVER, mysqlconnector.DRIVER, mysqldb.DRIVER, mariadbconnector.DRIVER)
    classifier = MySQLErrors
    maintainer = MySQLMaintenance
    base_features: ClassVar[Features] = MySQLFeatures()
    url_options = frozenset({options.FAILOVER_WINDOW, options.WRITERS})
    # Hex tokens in ASCII: padding cannot matter. BLOB stops at 64 KB; responses may be megabytes. InnoDB's primary
    # key is always named PRIMARY: a name in CREATE TABLE draws warning 1280 (which asyncmy logs). SQLAlchemy reads
    # table options under its dialect's name: mysql_* for mysql://, mariadb_* for mariadb://.
    columns = Columns(key=Utf8Bytes(VARBINARY(KEY_BYTES)), token=VARCHAR(64, charset="ascii", collation="ascii_bin"),
                      timestamp=DATETIME(fsp=6), blob=LONGBLOB(),
                      table_options={f"{prefix}_{k}": v for prefix in ("mysql", "mariadb") for k, v in
                                     {"engine": "InnoDB", "charset": "utf8mb4", "row_format": "DYNAMIC"}.items()},
                      named_primary_key=False)

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        pool = getattr(engine, "pool", None)
        if pool is not None and resets_by_hook(pool) and not event.contains(pool, "reset", _reset_unless_clean):
            event.listen(pool, "reset", _reset_unless_clean)

    @classmethod
    def engine_options(cls, url: URL, options: Mapping[str, Any]) -> dict[str, Any]:
        opts = dict(options)
        # A ROLLBACK on every return is one round trip per request; _reset_unless_clean sends it only when needed.
        opts.setdefault("pool_reset_on_return", None)
        return opts

    @classmethod
    def resolve_url(cls, url: URL) -> URL:
        # A bare mysql:// or mariadb:// means mysqlclient to SQLAlchemy; the [mysql] extra installs PyMySQL instead.
        if url.drivername == cls.name and find_spec("MySQLdb") is None and find_spec("pymysql") is not None:
            return url.set(drivername=f"{cls.name}+pymysql")
        return url

    def refine_features(self, features: Features) -> Flow[Features]:
        dialect = self.engine.dialect
        version = tuple(getattr(dialect, "server_version_info", None) or ())
        old = getattr(dialect, "is_mariadb", False) or version[:3] < (8, 0, 1)
        mariadb = getattr(dialect, "is_mariadb", False)
        skip_locked = version[:2] >= (10, 6) if mariadb else version[:3] >= (8, 0, 1)
        refined = (yield from super().refine_features(features)).replace(
            share_lock="LOCK IN SHARE MODE" if old else "FOR SHARE", skip_locked=skip_locked,
            insert_returning=bool(getattr(dialect, "insert_returning", False)))
        facts = yield from execute(self.prepared("server facts", lambda: statement(_SERVER_FACTS, Shape.ROWS)))
        found = {str(name).lower(): str(value) for name, value in facts}
        if found.get("max_allowed_packet", "").isdigit():
            refined = _with_packet(refined, int(found["max_allowed_packet"]))
        if found.get("wsrep_on", "").upper() == "ON":
            # Galera: a claim is not exclusive before commit (the first commit wins certification), so an atomic
            # effect callable may run on several nodes for one key; its database writes still land once. Unless
            # the URL says one node takes every session (a load balancer with backup servers): then the claim's
            # row lock excludes the other claimers, as on a single server.
            single = options.choice(self.engine.url, options.WRITERS, self.url_options) == "single"
            refined = refined.replace(wsrep=True, exclusive_claim=single, multi_primary=True)
        return refined

    def session_setup(self, dbapi_connection: Any) -> None:
        """A strict sql_mode (a value that does not fit raises instead of being truncated with a warning):
        STRICT_ALL_TABLES added only if neither strict mode is set, the rest of the session's sql_mode kept. On a
        Galera node, the sync-wait bits (whatever bits the session already has kept). Outside any transaction,
        since Galera waits for other nodes' commits only at a transaction's first statement, the claim itself.
        The session's max_allowed_packet, read in the same statement, lowers the store's statement limit if it is
        below it (`_session_packet`)."""
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT @@SESSION.sql_mode, @@SESSION.max_allowed_packet")
            mode, packet = cursor.fetchone()
            self._session_packet(packet)
            if not _STRICT_MODES & {m.strip().upper() for m in str(mode or "").split(",")}:
                cursor.execute("SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''),"
                               " 'STRICT_ALL_TABLES')")
            cursor.execute("SHOW VARIABLES LIKE 'wsrep_on'")
            row = cursor.fetchone()
            if row is not None and str(row[1]).upper() == "ON":
                cursor.execute(f"SET SESSION wsrep_sync_wait = @@SESSION.wsrep_sync_wait | {GALERA_SYNC_WAIT}")
        finally:
            cursor.close()

    def _session_packet(self, packet: object) -> None:
        """A new session's max_allowed_packet (fixed when it connects, from the server's global value): the
        statement limit is the lowest any session has had, so a limit lowered while the store runs (SET GLOBAL, a
        failover to a server configured lower) is known before a response is sent to a session that would refuse
        it. Never raised again: a session from before the change may still have the lower limit."""
        if isinstance(packet, int) and not isinstance(packet, bool):
            self.features = _with_packet(self.features, packet)

    # --- transactions and the clock --------------------------------------------------------------------------

    @contextmanager
    def transaction(self, conn: Connection, begin: Begin) -> Iterator[None]:
        conn.info.pop(_COMMITTED_CLEAN, None)
        if begin is Begin.PURGE:
            # A purge batch at REPEATABLE READ takes next-key locks on the index ranges it scans, which are the
            # ranges new claims insert into: measured, claims fell from 801/s to 34/s during a purge. At READ
            # COMMITTED it locks only the rows it deletes (no gap locks). SQLAlchemy sets the level for this
            # checkout and puts the connection's own back when it returns to the pool.
            conn.execution_options(isolation_level="READ COMMITTED")
        with conn.begin():
            yield
        conn.info[_COMMITTED_CLEAN] = True  # reached only once the COMMIT succeeded

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        micros = round(seconds * 1_000_000)
        expr = _UTC_NOW if micros == 0 else func.timestampadd(text("MICROSECOND"), micros, _UTC_NOW)
        return type_coerce(expr, DATETIME(fsp=6))

    # --- the protocol's statements ---------------------------------------------------------------------------

    def claim(self, table: Table, values: Mapping[str, Any], clock: Mapping[str, float], key: Mapping[str, str],
              fresh: bool) -> Flow[tuple[bool, Any]]:
        """Where the server has INSERT ... RETURNING (MariaDB), the claim and the committed winner in one statement
        that reports a duplicate without raising (`_claim_statement`); elsewhere (MySQL), and on a table with
        another unique index, the plain INSERT and its 1062, then the locking read."""
        returning = _returning(self)
        stmt = self.prepared(("claim", table, tuple(values), tuple(sorted(clock.items())), returning), lambda: (
            statement(_claim_statement(self, table, values, clock), Shape.ROW, table)
            if returning and _primary_key_is_only_unique_key(table) else None))
        if stmt is None:
            return (yield from super().claim(table, values, clock, key, fresh))
        row = yield from execute(stmt, params(values))
        if row is None:  # not an answer the statement gives; the protocol claims again
            return False, None
        return (True, None) if row.winner is None else (False, _winner(row.winner))

    def insert_if_absent(self, table: Table, values: Mapping[str, Any],
                         clock: Mapping[str, float] | None = None) -> Flow[bool]:
        stmt = self.prepared(("insert", table, tuple(values), tuple(sorted((clock or {}).items()))), lambda: (
            statement(table.insert().values(**insert_values(self, table, values, clock)), Shape.NOTHING,
                           table)))
        try:
            yield from execute(stmt, params(values))  # a duplicate rolls back this statement only
        except DBAPIError as exc:
            if self.errors.is_duplicate(exc) and (
                    _primary_key_is_only_unique_key(table) or (yield from self._primary_key_exists(table, values))):
                return False
            raise
        return True

    def _primary_key_exists(self, table: Table, values: Mapping[str, Any]) -> Flow[bool]:
        # 1062 names no index by code; the row with our primary key existing is what makes it our duplicate.
        # InnoDB checks the clustered (primary) index first, and the failed insert left a shared lock on the
        # duplicate record, so the row cannot vanish before this read.
        pk = [c.name for c in table.primary_key.columns]
        lock = self._share_lock()
        stmt = self.prepared(("pk exists", table, lock), lambda: statement(
            select(literal(1)).select_from(table).where(*key_is(table, pk)).suffix_with(lock), Shape.ROW, table))
        return (yield from execute(stmt, params({name: values[name] for name in pk}, "k_"))) is not None

    def read(self, table: Table, key: Mapping[str, str]) -> Flow[Any]:
        # A locking read returns the latest committed version, not the transaction's REPEATABLE READ snapshot.
        lock = self._share_lock()
        stmt = self.prepared(("read", table, tuple(key), lock), lambda: statement(
            select(*replay_columns(table, key), self.now().label("db_now")).where(*key_is(table, key))
            .suffix_with(lock), Shape.ROW, table))
        return (yield from execute(stmt, params(key, "k_")))

    def _share_lock(self) -> str:
        """The locking-read clause this server understands (a feature the live server decides)."""
        features = self.features
        assert isinstance(features, MySQLFeatures)
        return features.share_lock

    def not_waiting(self, table: Table, key: Mapping[str, str], claim: Flow[Any]) -> Flow[Any]:
        on = self.prepared("nowait on", lambda: statement(_NOWAIT_ON, Shape.NOTHING))
        off = self.prepared("nowait off", lambda: statement(_NOWAIT_OFF, Shape.NOTHING))
        yield from execute(on)
        try:
            result = yield from claim
        except GeneratorExit:
            raise
        except BaseException as exc:
            # The one-statement claim locks a completed record exclusively, so a concurrent replay of the same key
            # is busy too: a record already complete is replayed, not answered in flight.
            done = None
            if isinstance(exc, DBAPIError) and self.errors.is_lock_busy(exc) and _returning(self):
                done = yield from _completed(self, table, key)
            yield from execute(off)  # session state: the pool would hand the 0 on otherwise
            if done is None:
                raise
            return False, done
        yield from execute(off)
        return result

    def lock_batch(self, table: Table, columns: Sequence[ColumnElement[Any]], condition: ColumnElement[bool],
                   order_by: Sequence[ColumnElement[Any]], limit: int) -> Flow[list[Any]]:
        """FOR UPDATE SKIP LOCKED where the server has it (MySQL 8.0.1+, MariaDB 10.6+); before, FOR UPDATE, whose
        wait makes relays take turns (still never one command twice: the lease is written before the commit)."""
        features = self.features
        skip = isinstance(features, MySQLFeatures) and features.skip_locked
        stmt = self.prepared(("lock batch", table, condition, limit, skip), lambda: statement(
            select(*columns).where(condition).order_by(*order_by).limit(limit).with_for_update(skip_locked=skip),
            Shape.ROWS, table))
        return list((yield from execute(stmt)))

    def purge_batch(self, table: Table, condition: ColumnElement[bool], limit: int,
                    values: Mapping[str, Any] | None = None) -> Flow[int]:
        # Single-table DELETE ... LIMIT: one statement, no key list round trip. The limit is written into the text
        # (a validated int): as a parameter rendered at compile time it would need the condition's own parameters
        # (a range's edges, bound per batch) there too.
        return (yield from rowcount(self.prepared(("purge", table, condition, limit), lambda: statement(
            table.delete().where(condition).ext(mysql_limit(literal_column(str(int(limit))))), Shape.ROWCOUNT,
            table)), values))

    # --- operations ------------------------------------------------------------------------------------------

class MariaDBBackend(MySQLBackend):
    name = "mariadb"
    classifier = MariaDBErrors
    aliases = ("maria",)
    base_features: ClassVar[Features] = MySQLFeatures(share_lock="LOCK IN SHARE MODE")
