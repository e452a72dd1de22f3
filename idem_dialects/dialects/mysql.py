"""MySQL 8.4 and MariaDB (InnoDB): byte-exact keys, duplicates by error 1062, locking reads for the loser.

Why it looks like this (the engine page of the docs has the whole story): collations merge keys (even
``utf8mb4_bin`` is PAD SPACE), so identities are VARBINARY UTF-8; REPEATABLE READ snapshots hide the winner, so the
loser reads with a locking read; INSERT IGNORE / ON DUPLICATE KEY also silence other errors, so the claim is a plain
INSERT whose 1062 is confirmed against the primary key. The two engines differ only where this module says so
(locking read syntax, MariaDB's extra retryable 1020); Galera nodes are detected from the live server.
on_in_flight="conflict" claims with the session's innodb_lock_wait_timeout at 0 (MySQL's floor is 1 s), put back
after the claim statement: InnoDB has no NOWAIT for a duplicate INSERT's wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from importlib.util import find_spec
from typing import Any, ClassVar

from sqlalchemy import Engine, Select, UniqueConstraint, event, func, literal, literal_column, select, text, type_coerce
from sqlalchemy import column as sql_column
from sqlalchemy import table as sql_table
from sqlalchemy.dialects.mysql import DATETIME, LONGBLOB, VARBINARY, VARCHAR
from sqlalchemy.dialects.mysql import limit as mysql_limit
from sqlalchemy.engine import URL, Connection, ExceptionContext
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.pool import Pool, PoolResetState
from sqlalchemy.pool.base import ResetStyle  # not re-exported; tests/test_statement_counts.py fails if it moves
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table
from sqlalchemy.types import TypeEngine

from ..errors import CannotConnect, ConnectionConfigError, IdemError, RetryCause
from ..features import Features
from ..guard import MISSING_TABLE, NO_PRIVILEGE
from ..keys import MAX_LENGTH
from . import options
from .base import Backend
from .drivers import Driver
from .network import socket_problem
from .types import Utf8Bytes

# Server error codes (the first argument of PyMySQL's and mysqlclient's exceptions).
ER_DUP_ENTRY = 1062
ER_TABLE_EXISTS = 1050  # a concurrent CREATE TABLE of one name (DDL commits at once: the loser sees it)
ER_DUP_KEYNAME = 1061  # a concurrent CREATE INDEX of one name
ER_LOCK_WAIT_TIMEOUT = 1205
ER_LOCK_DEADLOCK = 1213
ER_CHECKREAD = 1020  # MariaDB: "Record has changed since last read" (innodb_snapshot_isolation)
CR_SERVER_GONE_ERROR = 2006
CR_SERVER_LOST = 2013
ER_NO_SUCH_TABLE = 1146
ER_ACCESS_DENIED = 1045
ER_BAD_DB = 1049
CR_CONN_HOST_ERROR = 2003
CR_UNKNOWN_HOST = 2005
ER_DBACCESS_DENIED = 1044
ER_TABLEACCESS_DENIED = 1142  # also "CREATE command denied"

ER_UNKNOWN_COM_ERROR = 1047  # Galera: "WSREP has not yet prepared node for application use" (node not ready)
ER_SERVER_SHUTDOWN = 1053  # the server is shutting down
ER_QUERY_INTERRUPTED = 1317  # KILL QUERY
ER_CONNECTION_KILLED = 1927  # MariaDB: KILL [CONNECTION] of this session
ER_STATEMENT_TIMEOUT = 1969  # MariaDB: max_statement_time exceeded
ER_QUERY_TIMEOUT = 3024  # MySQL: max_execution_time exceeded
# Opening a connection: what a retry can fix (nothing ran) and what only a changed configuration can.
_CONNECT_TRANSIENT = frozenset({
    2002, 2003,  # CR_CONNECTION_ERROR (socket), CR_CONN_HOST_ERROR (refused, unreachable)
    CR_SERVER_GONE_ERROR, CR_SERVER_LOST,  # dropped during the handshake (server starting or stopping)
    1040,  # ER_CON_COUNT_ERROR: too many connections
    1203,  # ER_TOO_MANY_USER_CONNECTIONS: the account's max_user_connections
    ER_UNKNOWN_COM_ERROR, ER_SERVER_SHUTDOWN,
})
_CONNECT_CONFIG = {
    1045: ("access denied for user {user!r}", "check the user and password in the URL"),
    1698: ("access denied for user {user!r}",
           "check the user and password in the URL (the account may need a password)"),
    1044: ("user {user!r} may not use database {database!r}", "grant the user access or use another database"),
    1049: ("the database {database!r} does not exist", "check the URL's database name or create it"),
    CR_UNKNOWN_HOST: ("the host name in the URL does not resolve", "check the URL's host"),  # mysqlclient
    2059: ("the authentication plugin cannot be loaded", "install PyMySQL[rsa] or change the account's plugin"),
}

KEY_BYTES = MAX_LENGTH * 4  # UTF-8 needs at most 4 bytes per character
_UTC_NOW: ColumnElement[Any] = literal_column("UTC_TIMESTAMP(6)")  # the DB clock, independent of the session time zone
# The claim's lock wait, refused (on_in_flight="conflict"): the session's value saved in a user variable, then back.
_NOWAIT_ON = text("SET @idem_lock_wait = @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = 0")
_NOWAIT_OFF = text("SET SESSION innodb_lock_wait_timeout = @idem_lock_wait")
_STRICT_MODES = frozenset({"STRICT_ALL_TABLES", "STRICT_TRANS_TABLES"})
_STRICT_CHECKED = "idem_dialects.strict_sql_mode"  # per-DBAPI-connection flag in Connection.info
# Galera's wsrep_sync_wait bits: 1 reads (and BEGIN), 2 UPDATE/DELETE, 4 INSERT/REPLACE. A node applies other
# nodes' write sets asynchronously; with these bits a statement first waits until this node has applied every
# write set committed anywhere before it began, so a claim never misses a record acknowledged on another node
# (without bit 4 the INSERT succeeds locally, the effect callable runs, and only certification stops it).
GALERA_SYNC_WAIT = 1 | 2 | 4
# Set in Connection.info (the pool record's) once the store's COMMIT succeeded; the pool's reset hook pops it.
_COMMITTED_CLEAN = "idem_dialects.committed_clean"
SERVER_STATUS_IN_TRANS = 1  # the server's status flag (OK/EOF packets): a transaction is open on the session


def _reset_unless_clean(dbapi_connection: Any, record: Any, state: PoolResetState) -> None:
    """The pool's reset on return, minus the ROLLBACK round trip when the connection is known to be clean: the
    store's own transaction committed last and (where the driver reports it, as PyMySQL does) the server's last
    status shows no transaction open. Anything else (application code, a failed commit) is rolled back."""
    clean = record is not None and record.info.pop(_COMMITTED_CLEAN, False)
    if state.terminate_only or state.transaction_was_reset or not state.asyncio_safe:
        return  # discarded, or the Connection already rolled its transaction back
    status = getattr(dbapi_connection, "server_status", None)
    if clean and not (isinstance(status, int) and status & SERVER_STATUS_IN_TRANS):
        return
    dbapi_connection.rollback()


def resets_by_hook(pool: Pool) -> bool:
    """The pool resets nothing itself (pool_reset_on_return=None, what `engine_options` asks for), so a returned
    connection is rolled back only by `_reset_unless_clean`, and only when it is not known clean. Pool has no public
    accessor for its reset style; tests/test_statement_counts.py fails if this private one moves."""
    return getattr(pool, "_reset_on_return", None) is ResetStyle.reset_none


def _client_side_disconnect(context: ExceptionContext) -> None:
    """mysql-connector-python raises client-side errors with errno -1, among them "MySQL Connection not available"
    after the server or the network dropped the socket, which SQLAlchemy's disconnect test (matching older wording)
    misses. For such an error ask the driver whether the connection still lives; if not, SQLAlchemy invalidates it
    and `run` retries on a fresh one, as for any lost connection."""
    if context.is_disconnect or getattr(context.original_exception, "errno", None) != -1:
        return
    conn = context.connection
    driver = None if conn is None or conn.closed or conn.invalidated else conn.connection.driver_connection
    is_connected = getattr(driver, "is_connected", None)
    if callable(is_connected) and not is_connected():
        context.is_disconnect = True


def error_code(exc: BaseException) -> int | None:
    """The server/client error number of a wrapped DBAPI error (PyMySQL, mysqlclient, mysql-connector)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and not isinstance(args[0], bool):
        return args[0]
    errno = getattr(orig, "errno", None)
    return errno if isinstance(errno, int) else None


def _primary_key_is_only_unique_key(table: Table) -> bool:
    """Then any 1062 on `table` is a duplicate primary key (true of the record tables this library creates)."""
    return not any(isinstance(c, UniqueConstraint) for c in table.constraints) and not any(
        index.unique for index in table.indexes)


# The connect_args with which these drivers open their connections in autocommit mode (refused by the store).
_AUTOCOMMIT = {"autocommit": True}


@dataclass(frozen=True, slots=True)
class MySQLFeatures(Features):
    # The server's spelling of a shared locking read: FOR SHARE (MySQL 8.0.1+) or LOCK IN SHARE MODE (MariaDB,
    # older MySQL; a mysql:// URL may reach either, so the live server decides).
    share_lock: str = "FOR SHARE"
    # A Galera node (wsrep_on): claims certify at commit, so two nodes can both hold a claim until one commits.
    wsrep: bool = False


class MySQLBackend(Backend):
    name = "mysql"
    base_features: ClassVar[Features] = MySQLFeatures()
    extra = "mysql"
    drivers = (
        Driver("pymysql", "pymysql", "idem-dialects[mysql]", autocommit_args=_AUTOCOMMIT),
        # Not aiomysql: 0.3.2 cannot bind bytes (the key columns) under PyMySQL 1.2 ("'str' object is not callable").
        Driver("asyncmy", "asyncmy", "idem-dialects[async]", sync=False, asynchronous=True,
               autocommit_args=_AUTOCOMMIT),
        Driver("mysqlconnector", "mysql.connector", "mysql-connector-python", autocommit_args=_AUTOCOMMIT),
        Driver("mysqldb", "MySQLdb", "mysqlclient", autocommit_args=_AUTOCOMMIT),
        Driver("mariadbconnector", "mariadb", "mariadb"),
    )
    provision = "idem_dialects.dialects.mysql_provision:MySQLProvision"
    url_options = frozenset({options.FAILOVER_WINDOW, options.WRITERS})
    retryable: ClassVar[Mapping[int, RetryCause]] = {
        ER_LOCK_DEADLOCK: RetryCause.DEADLOCK,
        ER_LOCK_WAIT_TIMEOUT: RetryCause.LOCK_TIMEOUT,
        CR_SERVER_GONE_ERROR: RetryCause.CONNECTION,
        CR_SERVER_LOST: RetryCause.CONNECTION,
        ER_SERVER_SHUTDOWN: RetryCause.CONNECTION,
        ER_CONNECTION_KILLED: RetryCause.CONNECTION,
        ER_UNKNOWN_COM_ERROR: RetryCause.CONNECT,  # the node refused the statement: nothing ran
        # A protocol statement cancelled while waiting on a key is contention (never retried for the effect's own).
        ER_STATEMENT_TIMEOUT: RetryCause.CANCELLED,
        ER_QUERY_TIMEOUT: RetryCause.CANCELLED,
        ER_QUERY_INTERRUPTED: RetryCause.CANCELLED,
    }

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        pool = getattr(engine, "pool", None)
        if pool is not None and resets_by_hook(pool):
            event.listen(pool, "reset", _reset_unless_clean)
        if isinstance(engine, Engine):
            event.listen(engine, "handle_error", _client_side_disconnect)

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

    # --- column types ----------------------------------------------------------------------------------------

    def key_type(self) -> TypeEngine[str]:
        return Utf8Bytes(VARBINARY(KEY_BYTES))

    def token_type(self) -> TypeEngine[str]:
        return VARCHAR(64, charset="ascii", collation="ascii_bin")  # hex only: padding cannot matter

    def timestamp_type(self) -> TypeEngine[datetime]:
        return DATETIME(fsp=6)

    def blob_type(self) -> TypeEngine[bytes]:
        return LONGBLOB()  # BLOB stops at 64 KB; responses may be megabytes

    def table_kwargs(self) -> dict[str, Any]:
        options = {"engine": "InnoDB", "charset": "utf8mb4", "row_format": "DYNAMIC"}
        # SQLAlchemy reads table options under its dialect's name: mysql_* for mysql://, mariadb_* for mariadb://.
        return {f"{prefix}_{k}": v for prefix in ("mysql", "mariadb") for k, v in options.items()}

    def primary_key_name(self, name: str) -> str | None:
        # InnoDB's primary key is always named PRIMARY: a name in CREATE TABLE draws warning 1280 ("Name ... ignored
        # for PRIMARY key"), which asyncmy logs on every create_tables.
        return None

    # --- transactions and the clock --------------------------------------------------------------------------

    @contextmanager
    def transaction(self, conn: Connection) -> Iterator[None]:
        conn.info.pop(_COMMITTED_CLEAN, None)
        if not conn.info.get(_STRICT_CHECKED) and not conn.in_transaction():
            # Session settings first, outside the transaction: Galera waits for other nodes' commits (wsrep_sync_wait)
            # only at a transaction's first statement, which should be the claim itself.
            self.ensure_strict(conn)
            conn.commit()
        with conn.begin():
            self.ensure_strict(conn)
            yield
        conn.info[_COMMITTED_CLEAN] = True  # reached only once the COMMIT succeeded

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        micros = round(seconds * 1_000_000)
        expr = _UTC_NOW if micros == 0 else func.timestampadd(text("MICROSECOND"), micros, _UTC_NOW)
        return type_coerce(expr, DATETIME(fsp=6))

    def ensure_strict(self, conn: Connection) -> None:
        """Make this connection's sql_mode strict (once per DBAPI connection), so a value that does not fit
        raises instead of being truncated with a warning. Adds STRICT_ALL_TABLES only if neither strict mode is
        set; the rest of the caller's sql_mode is kept."""
        if conn.info.get(_STRICT_CHECKED):
            return
        mode = conn.exec_driver_sql("SELECT @@SESSION.sql_mode").scalar()
        if not _STRICT_MODES & {m.strip().upper() for m in str(mode or "").split(",")}:
            conn.exec_driver_sql(
                "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'STRICT_ALL_TABLES')"
            )
        if getattr(self.live_features(conn), "wsrep", False):  # keeps whatever bits the session already has
            conn.exec_driver_sql(f"SET SESSION wsrep_sync_wait = @@SESSION.wsrep_sync_wait | {GALERA_SYNC_WAIT}")
        conn.info[_STRICT_CHECKED] = True

    def refine_features(self, conn: Connection, features: Features) -> Features:
        dialect = conn.dialect
        version = tuple(getattr(dialect, "server_version_info", None) or ())
        old = getattr(dialect, "is_mariadb", False) or version[:3] < (8, 0, 1)
        refined = super().refine_features(conn, features).replace(share_lock="LOCK IN SHARE MODE" if old else
                                                                  "FOR SHARE")
        # SHOW, not @@wsrep_on: MySQL has no such variable (and would raise), MariaDB without Galera says OFF.
        began = not conn.in_transaction()
        row = conn.exec_driver_sql("SHOW VARIABLES LIKE 'wsrep_on'").first()
        if began:  # end the transaction this read autobegan: the caller begins its own the way it needs
            conn.rollback()
        if row is not None and str(row[1]).upper() == "ON":
            # Galera: a claim is not exclusive before commit (the first commit wins certification), so an atomic
            # effect callable may run on several nodes for one key; its database writes still land once. Unless
            # the URL says one node takes every session (a load balancer with backup servers): then the claim's
            # row lock excludes the other claimers, as on a single server.
            single = options.choice(self.engine.url, options.WRITERS, self.url_options) == "single"
            refined = refined.replace(wsrep=True, exclusive_claim=single, multi_primary=True)
        return refined

    def share_lock(self, conn: Connection) -> str:
        """The locking-read clause this server understands (a feature the live server decides)."""
        features = self.live_features(conn)
        assert isinstance(features, MySQLFeatures)
        return features.share_lock

    # --- the protocol's statements ---------------------------------------------------------------------------

    def insert_if_absent(
        self, conn: Connection, table: Table, values: Mapping[str, Any], clock: Mapping[str, float] | None = None
    ) -> bool:
        self.ensure_strict(conn)
        stmt = self.prepared_insert(table, values, clock, lambda v: table.insert().values(**v))
        try:
            conn.execute(stmt, self.params(values))  # a duplicate rolls back this statement only
        except IntegrityError as exc:
            if self.is_duplicate(exc) and (
                _primary_key_is_only_unique_key(table) or self._primary_key_exists(conn, table, values)
            ):
                return False
            raise
        return True

    def _primary_key_exists(self, conn: Connection, table: Table, values: Mapping[str, Any]) -> bool:
        # 1062 names no index by code; the row with our primary key existing is what makes it our duplicate.
        # InnoDB checks the clustered (primary) index first, and the failed insert left a shared lock on the
        # duplicate record, so the row cannot vanish before this read.
        pk = [c.name for c in table.primary_key.columns]

        def build() -> Any:
            where = [table.c[name] == bind for name, bind in self.binds(table, pk, "k_").items()]
            return select(literal(1)).select_from(table).where(*where).suffix_with(self.share_lock(conn))

        stmt = self.prepared(("pk exists", table), build)
        return conn.execute(stmt, self.params({name: values[name] for name in pk}, "k_")).first() is not None

    def read_statement(self, conn: Connection, table: Table, key: Iterable[str]) -> Select[Any]:
        # A locking read returns the latest committed version, not the transaction's REPEATABLE READ snapshot.
        return super().read_statement(conn, table, key).suffix_with(self.share_lock(conn))

    def purge_batch(self, conn: Connection, table: Table, condition: ColumnElement[bool], limit: int) -> int:
        # Single-table DELETE ... LIMIT: one statement, no key list round trip.
        return conn.execute(table.delete().where(condition).ext(mysql_limit(limit))).rowcount

    # --- operations ------------------------------------------------------------------------------------------

    def size_statement(self, table: Table) -> Select[Any]:
        # InnoDB's estimates (the clustered primary key is the data; INDEX_LENGTH the secondary indexes), refreshed
        # with its persistent statistics; MySQL 8 caches them up to information_schema_stats_expiry (a day).
        tables = sql_table("TABLES", sql_column("TABLE_SCHEMA"), sql_column("TABLE_NAME"), sql_column("DATA_LENGTH"),
                           sql_column("INDEX_LENGTH"), schema="information_schema")
        return select(tables.c.DATA_LENGTH, tables.c.INDEX_LENGTH).where(
            tables.c.TABLE_SCHEMA == func.database(), tables.c.TABLE_NAME == table.name)

    # --- error classification --------------------------------------------------------------------------------

    def is_duplicate(self, exc: DBAPIError) -> bool:
        return error_code(exc) == ER_DUP_ENTRY

    def is_already_created(self, exc: DBAPIError) -> bool:
        return error_code(exc) in (ER_TABLE_EXISTS, ER_DUP_KEYNAME)

    @contextmanager
    def not_waiting(self, conn: Connection, table: Table, key: Mapping[str, str]) -> Iterator[None]:
        conn.execute(_NOWAIT_ON)
        try:
            yield
        finally:
            conn.execute(_NOWAIT_OFF)  # session state: the pool would hand the 0 on otherwise

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        return error_code(exc) == ER_LOCK_WAIT_TIMEOUT


    def config_problem(self, exc: DBAPIError, context: ExceptionContext, tables: Sequence[str]) -> str | None:
        code = error_code(exc)
        if code == ER_NO_SUCH_TABLE:
            return MISSING_TABLE
        return NO_PRIVILEGE if code in (ER_DBACCESS_DENIED, ER_TABLEACCESS_DENIED) else None

    def autocommit_setting(self, conn: Connection) -> str | None:
        dbapi = conn.connection.dbapi_connection
        # mysql-connector's `autocommit` property asks the server (a round trip); it keeps the value it set here.
        own = getattr(dbapi, "_autocommit", None) if conn.dialect.driver == "mysqlconnector" else None
        if isinstance(own, bool):
            return self.autocommit_name(conn.dialect.driver) if own else None
        return super().autocommit_setting(conn)

    def connect_error(self, exc: BaseException) -> IdemError | None:
        code = error_code(exc)
        if code in _CONNECT_CONFIG:
            what, fix = _CONNECT_CONFIG[code]
            what = what.format(user=self.engine.url.username, database=self.engine.url.database)
            return ConnectionConfigError(self.name, f"{what} (error {code})", fix)
        # 2003 (refused, unreachable) is also PyMySQL's and asyncmy's code for a host name that does not resolve:
        # the socket error under it tells them apart.
        problem = socket_problem(self.name, exc)
        if problem is not None:
            return problem
        if code in _CONNECT_TRANSIENT or self.retry_cause(exc) is not None:
            return CannotConnect(self.name, exc)
        return super().connect_error(exc)

    @classmethod
    def pool_reset_round_trip(cls, pool: Pool) -> bool:
        # The drivers send ROLLBACK even with no transaction open, unless `_reset_unless_clean` does the reset.
        return not resets_by_hook(pool)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        if not isinstance(exc, DBAPIError):
            return super().retry_cause(exc)  # the library's own transient errors
        code = error_code(exc)
        galera = getattr(getattr(self, "features", self.base_features), "wsrep", False)
        if galera and code in (ER_LOCK_DEADLOCK, ER_UNKNOWN_COM_ERROR):
            # Galera reports a lost certification (another node's commit of the same key won) and a brute-force
            # abort by an applier as 1213, and a node outside the primary component (joining, partitioned) as 1047.
            return RetryCause.CERTIFICATION if code == ER_LOCK_DEADLOCK else RetryCause.NODE_NOT_READY
        cause = None if code is None else self.retryable.get(code)
        # Otherwise only a connection SQLAlchemy invalidated (its own disconnect detection): a fresh one is safe.
        return cause or super().retry_cause(exc)


class MariaDBBackend(MySQLBackend):
    name = "mariadb"
    aliases = ("maria",)
    provision = "idem_dialects.dialects.mysql_provision:MariaDBProvision"
    base_features: ClassVar[Features] = MySQLFeatures(share_lock="LOCK IN SHARE MODE")
    retryable: ClassVar[Mapping[int, RetryCause]] = {
        **MySQLBackend.retryable,
        # With innodb_snapshot_isolation=ON (default from 11.6), a locking read or write of a row committed
        # after the transaction's snapshot fails with 1020 instead of reading it: retry in a new transaction.
        ER_CHECKREAD: RetryCause.SERIALIZATION,
    }
