"""Oracle Database 23ai/26ai through python-oracledb (thin mode): no upsert-ignore, '' is NULL, NLS decides
how text compares, and SERIALIZABLE reads from the transaction's start.

- Identities are stored as their UTF-8 bytes in RAW columns. RAW compares byte for byte whatever the session's
  NLS_COMP/NLS_SORT (a LINGUISTIC, case-insensitive session would equate 'A' and 'a' in a VARCHAR2), whatever the
  database character set (a single-byte one could not hold every key) and without MAX_STRING_SIZE=EXTENDED, which
  a declared column collation (COLLATE BINARY) needs. 255 characters x 4 bytes = RAW(1020); the three-column
  primary key is 3060 bytes, well under the 6398-byte index key limit of an 8K block (ORA-01450).
- The claim is a plain INSERT. Oracle rolls back only the failing statement on ORA-00001 (statement-level
  atomicity), so the caller's transaction stays usable without a savepoint's two extra round trips. An INSERT that
  meets another session's uncommitted duplicate waits on the unique index entry: it fails with ORA-00001 once the
  winner commits, and succeeds (a claim) if the winner rolls back.
- Errors are classified by the driver's numeric error code (``exc.orig.args[0].code``), never by message text;
  ``full_code`` is not used either, since the driver parses it out of the message.
- Times are TIMESTAMP columns filled from SYS_EXTRACT_UTC(SYSTIMESTAMP), the database's clock in UTC.
- An INSERT waiting on another session's uncommitted key has no lock timeout (NOWAIT and WAIT n are for row locks
  and DDL only). `run(..., on_in_flight="conflict")` therefore takes a user lock named after the table and key first,
  DBMS_LOCK.REQUEST in exclusive mode with a timeout of 0, released at commit or rollback: a second claimer of the key
  that also asks not to wait gets ORA-00054 at once, answered in flight. It needs EXECUTE on SYS.DBMS_LOCK, and
  excludes only claimers that use the option (a waiting claimer takes no user lock).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    TIMESTAMP,
    Integer,
    LargeBinary,
    Numeric,
    String,
    and_,
    bindparam,
    delete,
    func,
    literal_column,
    select,
    text,
    type_coerce,
)
from sqlalchemy.dialects.oracle import RAW
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table
from sqlalchemy.types import TypeDecorator

from ..drivers import cx_oracle, oracledb
from ..errors import InvalidPayload, WinnerNotVisible
from ..features import Features
from ..keys import MAX_LENGTH, check_identifier
from ..steps import Flow, Shape, execute, rowcount
from .base import Backend, Columns, configured_isolation, insert_values, params, statement
from .oracle_errors import OracleErrors
from .oracle_maintenance import OracleMaintenance
from .types import Utf8Bytes

# The user lock of on_in_flight="conflict": ORA_HASH of the table and key (NUL-separated) as the lock id, in
# DBMS_LOCK's range for user locks; result 1 (timeout) raised as ORA-00054, 0 (granted) and 4 (already ours) pass.
_NOWAIT_LOCK = text(
    "DECLARE busy EXCEPTION; PRAGMA EXCEPTION_INIT(busy, -54); lock_id INTEGER; result INTEGER;"
    " BEGIN SELECT ORA_HASH(:idem_lock_name, 1073741823) INTO lock_id FROM dual;"
    " result := DBMS_LOCK.REQUEST(id => lock_id, lockmode => DBMS_LOCK.X_MODE, timeout => 0,"
    " release_on_commit => TRUE);"
    " IF result = 1 THEN RAISE busy; ELSIF result NOT IN (0, 4) THEN"
    " RAISE_APPLICATION_ERROR(-20054, 'DBMS_LOCK.REQUEST returned ' || result); END IF; END;")
KEY_BYTES = MAX_LENGTH * 4  # UTF-8 needs at most 4 bytes per code point
_FIELDS = {"idem_key": "key"}  # column name -> the name InvalidKey reports (the API's)


class NonEmptyString(TypeDecorator[str]):
    """VARCHAR2 that refuses '' rather than let Oracle store it as NULL."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if value == "":
            raise InvalidPayload("value", "is an empty string, which Oracle would store as NULL")
        return value


class NonEmptyBlob(TypeDecorator[bytes]):
    """BLOB that refuses b'' rather than let Oracle store it as NULL (stored responses carry a kind tag, so an
    empty response is never empty bytes)."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: bytes | None, dialect: Dialect) -> bytes | None:
        if value is not None and len(value) == 0:
            raise InvalidPayload("value", "is empty bytes, which Oracle would store as NULL")
        return value


def _guard_identity(table: Table, values: Mapping[str, Any]) -> None:
    """Reject an empty (or otherwise invalid) identity before the INSERT: Oracle would turn '' into NULL."""
    for column in table.primary_key.columns:
        check_identifier(_FIELDS.get(column.name, column.name), values.get(column.name))


class OracleBackend(Backend):
    name = "oracle"
    # python-oracledb serves both; create_async_engine picks its async mode.
    drivers = (oracledb.DRIVER, cx_oracle.DRIVER)
    classifier = OracleErrors
    maintainer = OracleMaintenance
    aliases = ("oracledb",)
    base_features = Features(isolation_levels=("READ COMMITTED", "SERIALIZABLE"))  # the only two Oracle has
    # Tokens are lower-case hex: equal under every NLS sort exactly when equal byte for byte, so VARCHAR2 is safe
    # there. TIMESTAMP: DateTime would be DATE on Oracle, whole seconds only. BLOB: responses may exceed RAW's 2000
    # bytes.
    columns = Columns(key=Utf8Bytes(RAW(KEY_BYTES)), token=NonEmptyString(64), timestamp=TIMESTAMP(),
                      blob=NonEmptyBlob())

    # --- the clock -------------------------------------------------------------------------------------------

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        now: ColumnElement[Any] = func.sys_extract_utc(literal_column("SYSTIMESTAMP"))
        if seconds:
            amount = bindparam(None, Decimal(f"{seconds:.6f}"), type_=Numeric(18, 6))
            now = now + func.numtodsinterval(amount, literal_column("'SECOND'"))
        return type_coerce(now, TIMESTAMP())

    # --- the protocol's statements ---------------------------------------------------------------------------

    def insert_if_absent(self, table: Table, values: Mapping[str, Any],
                         clock: Mapping[str, float] | None = None) -> Flow[bool]:
        _guard_identity(table, values)
        stmt = self.prepared(("insert", table, tuple(values), tuple(sorted((clock or {}).items()))), lambda: (
            statement(table.insert().values(**insert_values(self, table, values, clock)), Shape.NOTHING,
                           table)))
        try:
            yield from execute(stmt, params(values))
        except DBAPIError as exc:
            if self.errors.is_duplicate(exc):
                return False  # only the INSERT was rolled back; the transaction goes on
            raise
        return True

    def read(self, table: Table, key: Mapping[str, str]) -> Flow[Any]:
        """A plain consistent read: under READ COMMITTED each statement sees the latest committed row, so the
        loser sees the winner. No FOR UPDATE: it would make the loser hold the winner's row lock until its own
        transaction ends, and it finds nothing more than the snapshot does. Under SERIALIZABLE a winner that
        committed after our snapshot is invisible: raise WinnerNotVisible (retried like ORA-08177) when the
        engine's level is known from SQLAlchemy; otherwise the store's claim loop ends in a ClaimRaced, also
        retried. (SELECT ... FOR UPDATE does not help: it only locks rows the snapshot finds.)"""
        row = yield from super().read(table, key)
        if row is None and configured_isolation(self.engine) == "SERIALIZABLE":
            raise WinnerNotVisible(table.name)
        return row

    def not_waiting(self, table: Table, key: Mapping[str, str], claim: Flow[Any]) -> Flow[Any]:
        lock = self.prepared("nowait", lambda: statement(_NOWAIT_LOCK, Shape.NOTHING))
        yield from execute(lock, {"idem_lock_name": "\x00".join([table.name, *key.values()])})
        return (yield from claim)  # the user lock is released when the transaction ends

    def lock_batch(self, table: Table, columns: Sequence[ColumnElement[Any]], condition: ColumnElement[bool],
                   order_by: Sequence[ColumnElement[Any]], limit: int) -> Flow[list[Any]]:
        """``SELECT ... FROM t WHERE ROWID IN (SELECT rid FROM (SELECT ROWID rid ... ORDER BY ...) WHERE ROWNUM <= n)
        FOR UPDATE SKIP LOCKED``: Oracle refuses FOR UPDATE beside FETCH FIRST or an ordered inline view (ORA-02014),
        so the first n are chosen inside and the outer query, a plain one on the table, locks them, skipping those
        another relay holds (which may leave fewer than n: the next claim takes the rest)."""
        def build() -> Any:
            rowid: ColumnElement[Any] = literal_column("ROWID")
            ordered = (select(rowid.label("rid")).select_from(table).where(condition).order_by(*order_by)
                       .correlate(None).subquery("due"))
            first = select(ordered.c.rid).where(literal_column("ROWNUM") <= bindparam(None, limit, type_=Integer()))
            return statement(select(*columns).where(rowid.in_(first)).with_for_update(skip_locked=True),
                             Shape.ROWS, table)

        return list((yield from execute(self.prepared(("lock batch", table, condition, limit), build))))

    def purge_batch(self, table: Table, condition: ColumnElement[bool], limit: int,
                    values: Mapping[str, Any] | None = None) -> Flow[int]:
        """One statement: delete by ROWID the first `limit` rows matching `condition` (ROWNUM works on every
        version, unlike FETCH FIRST before 12c). `condition` is repeated outside so that a row changed by another
        transaction in between is re-checked (write consistency restarts on the columns it names)."""
        def build() -> Any:
            rowid: ColumnElement[Any] = literal_column("ROWID")
            batch = select(rowid).select_from(table).where(condition, literal_column("ROWNUM") <= bindparam(
                None, limit, type_=Integer()))
            return statement(delete(table).where(and_(rowid.in_(batch), condition)), Shape.ROWCOUNT, table)

        return (yield from rowcount(self.prepared(("purge", table, condition, limit), build), values))

    # --- operations ------------------------------------------------------------------------------------------

    @property
    def db_system_name(self) -> str:
        return "oracle.db"

