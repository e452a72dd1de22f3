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

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    literal,
    literal_column,
    or_,
    select,
    text,
    type_coerce,
)
from sqlalchemy import column as sql_column
from sqlalchemy import table as sql_table
from sqlalchemy.dialects.oracle import RAW
from sqlalchemy.engine import Connection, Dialect, ExceptionContext
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table
from sqlalchemy.types import TypeDecorator, TypeEngine

from ..errors import CannotConnect, ConnectionConfigError, IdemError, InvalidPayload, RetryCause, WinnerNotVisible
from ..features import Features
from ..guard import MISSING_TABLE, NO_PRIVILEGE
from ..keys import MAX_LENGTH, check_identifier
from .base import AnyRow, Backend, configured_isolation
from .drivers import Driver
from .network import socket_problem
from .types import Utf8Bytes

# Oracle error numbers (``_Error.code``), as the server sends them.
ORA_UNIQUE_VIOLATED = 1  # ORA-00001: unique constraint violated -- the only duplicate
ORA_RESOURCE_BUSY = 54  # ORA-00054: resource busy and acquire with NOWAIT specified or timeout expired
ORA_DEADLOCK = 60  # ORA-00060: deadlock detected; only the one statement was rolled back
ORA_CANNOT_SERIALIZE = 8177  # ORA-08177: can't serialize access for this transaction
ORA_LOCK_WAIT_TIMEOUT = 30006  # ORA-30006: resource busy; acquire with WAIT timeout expired
# The user lock of on_in_flight="conflict": ORA_HASH of the table and key (NUL-separated) as the lock id, in
# DBMS_LOCK's range for user locks; result 1 (timeout) raised as ORA-00054, 0 (granted) and 4 (already ours) pass.
_NOWAIT_LOCK = text(
    "DECLARE busy EXCEPTION; PRAGMA EXCEPTION_INIT(busy, -54); lock_id INTEGER; result INTEGER;"
    " BEGIN SELECT ORA_HASH(:idem_lock_name, 1073741823) INTO lock_id FROM dual;"
    " result := DBMS_LOCK.REQUEST(id => lock_id, lockmode => DBMS_LOCK.X_MODE, timeout => 0,"
    " release_on_commit => TRUE);"
    " IF result = 1 THEN RAISE busy; ELSIF result NOT IN (0, 4) THEN"
    " RAISE_APPLICATION_ERROR(-20054, 'DBMS_LOCK.REQUEST returned ' || result); END IF; END;")
ORA_NAME_USED = 955  # ORA-00955: name is already used by an existing object (a concurrent CREATE TABLE/INDEX)
ORA_NO_TABLE = 942  # ORA-00942: table or view does not exist
ORA_NO_PRIVILEGE = 1031  # ORA-01031: insufficient privileges
# Not duplicates, and not retryable: ORA-01400 (NOT NULL), ORA-02290 (CHECK), ORA-02291/02292 (foreign key).
_RETRYABLE = {
    ORA_CANNOT_SERIALIZE: RetryCause.SERIALIZATION,
    ORA_DEADLOCK: RetryCause.DEADLOCK,
    ORA_RESOURCE_BUSY: RetryCause.BUSY,
    ORA_LOCK_WAIT_TIMEOUT: RetryCause.LOCK_TIMEOUT,
}

# Opening a connection: ORA numbers only a changed configuration fixes, and ones a retry may outlast.
_CONNECT_CONFIG = {
    1017: ("invalid user name or password (ORA-01017)", "check the user and password in the URL"),
    28000: ("the account is locked (ORA-28000)", "unlock it or use another account"),
    12514: ("the listener does not know the service (ORA-12514)", "check ?service_name= in the URL"),
    12505: ("the listener does not know the SID (ORA-12505)", "check the SID or use ?service_name="),
}
_CONNECT_TRANSIENT = frozenset({
    1033, 1034, 1089,  # starting up or shutting down, not available, immediate shutdown in progress
    12170, 12516, 12519, 12520, 12528, 12537, 12541, 12543,  # timeouts, no handler, blocked, closed, no listener
})
# python-oracledb thin's own connect errors (code 0, full_code DPY-...): cannot connect, listener refused, closed;
# and its spelling of ORA-12514/ORA-12505 (thin mode asks the listener itself).
_DPY_CONNECT = frozenset({"DPY-6005", "DPY-6000", "DPY-4011"})
_DPY_CONFIG = {"DPY-6001": _CONNECT_CONFIG[12514], "DPY-6003": _CONNECT_CONFIG[12505]}

KEY_BYTES = MAX_LENGTH * 4  # UTF-8 needs at most 4 bytes per code point
_FIELDS = {"idem_key": "key"}  # column name -> the name InvalidKey reports (the API's)


def ora_code(exc: BaseException) -> int | None:
    """The Oracle error number of a driver error (wrapped by SQLAlchemy or not), or None if it has none."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    args = getattr(orig, "args", None)
    if not args:
        return None
    code = getattr(args[0], "code", None)  # oracledb raises Error(_Error): the number comes from the wire
    if isinstance(code, bool) or not isinstance(code, int) or code <= 0:
        return None
    return code


def dpy_code(exc: BaseException) -> str | None:
    """python-oracledb's own error code (``DPY-NNNN``, errors raised by the driver rather than the server)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    args = getattr(orig, "args", None) or (None,)
    code = getattr(args[0], "full_code", None)
    return code if isinstance(code, str) and code.startswith("DPY-") else None


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
    aliases = ("oracledb",)
    extra = "oracle"
    # python-oracledb serves both; create_async_engine picks its async mode.
    drivers = (Driver("oracledb", "oracledb", "idem-dialects[oracle]", asynchronous=True),
               Driver("cx_oracle", "cx_Oracle", "cx_Oracle"))
    provision = "idem_dialects.dialects.oracle_provision:OracleProvision"
    base_features = Features(isolation_levels=("READ COMMITTED", "SERIALIZABLE"))  # the only two Oracle has

    # --- column types ----------------------------------------------------------------------------------------

    def key_type(self) -> TypeEngine[str]:
        return Utf8Bytes(RAW(KEY_BYTES))

    def token_type(self) -> TypeEngine[str]:
        # Lower-case hex: equal under every NLS sort exactly when equal byte for byte, so VARCHAR2 is safe here.
        return NonEmptyString(64)

    def timestamp_type(self) -> TypeEngine[datetime]:
        return TIMESTAMP()  # DateTime would be DATE on Oracle: whole seconds only

    def blob_type(self) -> TypeEngine[bytes]:
        return NonEmptyBlob()  # BLOB: responses may exceed RAW's 2000 bytes

    # --- the clock -------------------------------------------------------------------------------------------

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        now: ColumnElement[Any] = func.sys_extract_utc(literal_column("SYSTIMESTAMP"))
        if seconds:
            amount = bindparam(None, Decimal(f"{seconds:.6f}"), type_=Numeric(18, 6))
            now = now + func.numtodsinterval(amount, literal_column("'SECOND'"))
        return type_coerce(now, TIMESTAMP())

    # --- the protocol's statements ---------------------------------------------------------------------------

    def insert_if_absent(
        self, conn: Connection, table: Table, values: Mapping[str, Any], clock: Mapping[str, float] | None = None
    ) -> bool:
        _guard_identity(table, values)
        stmt = self.prepared_insert(table, values, clock, lambda v: table.insert().values(**v))
        try:
            conn.execute(stmt, self.params(values))
        except IntegrityError as exc:
            if self.is_duplicate(exc):
                return False  # only the INSERT was rolled back; the transaction goes on
            raise
        return True

    def read_row(self, conn: Connection, table: Table, key: Mapping[str, str]) -> AnyRow | None:
        """A plain consistent read: under READ COMMITTED each statement sees the latest committed row, so the
        loser sees the winner. No FOR UPDATE: it would make the loser hold the winner's row lock until its own
        transaction ends, and it finds nothing more than the snapshot does. Under SERIALIZABLE a winner that
        committed after our snapshot is invisible: raise WinnerNotVisible (retried like ORA-08177) when the
        level is known from SQLAlchemy; otherwise the store's claim loop ends in a ClaimRaced, also retried.
        (SELECT ... FOR UPDATE does not help: it only locks rows the snapshot finds.)"""
        row = super().read_row(conn, table, key)
        if row is None and configured_isolation(conn) == "SERIALIZABLE":
            raise WinnerNotVisible(table.name)
        return row

    def purge_batch(self, conn: Connection, table: Table, condition: ColumnElement[bool], limit: int) -> int:
        """One statement: delete by ROWID the first `limit` rows matching `condition` (ROWNUM works on every
        version, unlike FETCH FIRST before 12c). `condition` is repeated outside so that a row changed by another
        transaction in between is re-checked (write consistency restarts on the columns it names)."""
        rowid: ColumnElement[Any] = literal_column("ROWID")
        batch = select(rowid).select_from(table).where(condition, literal_column("ROWNUM") <= bindparam(
            None, limit, type_=Integer()))
        return conn.execute(delete(table).where(and_(rowid.in_(batch), condition))).rowcount

    # --- operations ------------------------------------------------------------------------------------------

    @property
    def db_system_name(self) -> str:
        return "oracle.db"

    def size_statement(self, table: Table) -> Executable:
        # The schema's own segments: the table's and its LOB columns' (large responses) as the table, its indexes'
        # (LOB indexes included) as the index size. A table without rows may have no segment yet (deferred segment
        # creation): 0 bytes.
        segments = sql_table("user_segments", sql_column("segment_name"), sql_column("bytes"))
        lobs = sql_table("user_lobs", sql_column("table_name"), sql_column("segment_name"))
        indexes = sql_table("user_indexes", sql_column("table_name"), sql_column("index_name"))
        name = literal(self.engine.dialect.denormalize_name(table.name))  # as the data dictionary spells it

        def total(condition: ColumnElement[bool]) -> Any:
            return select(func.coalesce(func.sum(segments.c.bytes), 0)).where(condition).scalar_subquery()

        own_lobs = select(lobs.c.segment_name).where(lobs.c.table_name == name)
        own_indexes = select(indexes.c.index_name).where(indexes.c.table_name == name)
        return select(total(or_(segments.c.segment_name == name, segments.c.segment_name.in_(own_lobs))),
                      total(segments.c.segment_name.in_(own_indexes)))

    # --- error classification --------------------------------------------------------------------------------

    def is_duplicate(self, exc: DBAPIError) -> bool:
        return ora_code(exc) == ORA_UNIQUE_VIOLATED

    def is_already_created(self, exc: DBAPIError) -> bool:
        return ora_code(exc) == ORA_NAME_USED

    @contextmanager
    def not_waiting(self, conn: Connection, table: Table, key: Mapping[str, str]) -> Iterator[None]:
        conn.execute(_NOWAIT_LOCK, {"idem_lock_name": "\x00".join([table.name, *key.values()])})
        yield  # the user lock is released when the transaction ends

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        return ora_code(exc) == ORA_RESOURCE_BUSY


    def config_problem(self, exc: DBAPIError, context: ExceptionContext, tables: Sequence[str]) -> str | None:
        return {ORA_NO_TABLE: MISSING_TABLE, ORA_NO_PRIVILEGE: NO_PRIVILEGE}.get(ora_code(exc) or 0)

    def connect_error(self, exc: BaseException) -> IdemError | None:
        code, dpy = ora_code(exc), dpy_code(exc)
        config = _CONNECT_CONFIG.get(code or 0) or _DPY_CONFIG.get(dpy or "")
        if config is not None:
            return ConnectionConfigError(self.name, *config)
        if code in _CONNECT_TRANSIENT or dpy in _DPY_CONNECT:
            problem = socket_problem(self.name, exc)  # DPY-6005 also wraps a host name that does not resolve
            return problem if problem is not None else CannotConnect(self.name, exc)
        return super().connect_error(exc)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        """ORA-08177, ORA-00060, ORA-00054, ORA-30006 and lost connections. After ORA-00060 Oracle has rolled
        back only the one statement and the session still holds its locks: `run` retries in a new transaction,
        and the failed one is rolled back explicitly when its `conn.begin()` block exits with the error."""
        cause = super().retry_cause(exc)
        if cause is not None:
            return cause
        if isinstance(exc, DBAPIError):
            code = ora_code(exc)
            if code is not None:
                return _RETRYABLE.get(code)
        return None
