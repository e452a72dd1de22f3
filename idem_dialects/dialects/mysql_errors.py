"""MySQL's and MariaDB's errors, by server (or client) error number: the first argument of PyMySQL's, mysqlclient's
and asyncmy's exceptions, ``errno`` of mysql-connector's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sqlalchemy.exc import DBAPIError

from ..errors import CannotConnect, ConnectionConfigError, IdemError, RetryCause
from .classify import MISSING_TABLE, NO_PRIVILEGE, ErrorClassifier, credentials_fix
from .network import socket_problem

ER_DUP_ENTRY = 1062
ER_TABLE_EXISTS = 1050  # a concurrent CREATE TABLE of one name (DDL commits at once: the loser sees it)
ER_DUP_KEYNAME = 1061  # a concurrent CREATE INDEX of one name
ER_LOCK_WAIT_TIMEOUT = 1205
ER_LOCK_DEADLOCK = 1213
ER_TABLE_DEF_CHANGED = 1412  # a consistent read of a table made after the snapshot (a generation's rotation)
ER_CHECKREAD = 1020  # MariaDB: "Record has changed since last read" (innodb_snapshot_isolation)
CR_SERVER_GONE_ERROR = 2006
CR_SERVER_LOST = 2013
ER_NO_SUCH_TABLE = 1146
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


def error_code(exc: BaseException) -> int | None:
    """The server/client error number of a driver error, wrapped by SQLAlchemy or not."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and not isinstance(args[0], bool):
        return args[0]
    errno = getattr(orig, "errno", None)
    return errno if isinstance(errno, int) else None


class MySQLErrors(ErrorClassifier):
    retryable: ClassVar[Mapping[int, RetryCause]] = {
        ER_LOCK_DEADLOCK: RetryCause.DEADLOCK,
        ER_LOCK_WAIT_TIMEOUT: RetryCause.LOCK_TIMEOUT,
        ER_TABLE_DEF_CHANGED: RetryCause.SERIALIZATION,  # "Table definition has changed, please retry transaction"
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

    def is_duplicate(self, exc: DBAPIError) -> bool:
        return error_code(exc) == ER_DUP_ENTRY

    def is_already_created(self, exc: DBAPIError) -> bool:
        return error_code(exc) in (ER_TABLE_EXISTS, ER_DUP_KEYNAME)

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        return error_code(exc) == ER_LOCK_WAIT_TIMEOUT

    def config_problem(self, exc: DBAPIError, tables: Sequence[str], dbapi_connection: Any) -> str | None:
        code = error_code(exc)
        if code == ER_NO_SUCH_TABLE:
            return MISSING_TABLE
        return NO_PRIVILEGE if code in (ER_DBACCESS_DENIED, ER_TABLEACCESS_DENIED) else None

    def connect_error(self, exc: BaseException) -> IdemError | None:
        code = error_code(exc)
        if code in _CONNECT_CONFIG:
            what, fix = _CONNECT_CONFIG[code]
            url = self.backend.engine.url
            what = what.format(user=url.username, database=url.database)
            fix = credentials_fix(fix, url) if code in (1045, 1698) else fix  # access denied
            return ConnectionConfigError(self.backend.name, f"{what} (error {code})", fix)
        # 2003 (refused, unreachable) is also PyMySQL's and asyncmy's code for a host name that does not resolve:
        # the socket error under it tells them apart.
        problem = socket_problem(self.backend.name, exc)
        if problem is not None:
            return problem
        if code in _CONNECT_TRANSIENT or self.retry_cause(exc) is not None:
            return CannotConnect(self.backend.name, exc)
        return super().connect_error(exc)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        if not isinstance(exc, DBAPIError):
            return super().retry_cause(exc)  # the library's own transient errors
        code = error_code(exc)
        if getattr(self.backend.features, "wsrep", False) and code in (ER_LOCK_DEADLOCK, ER_UNKNOWN_COM_ERROR):
            # Galera reports a lost certification (another node's commit of the same key won) and a brute-force
            # abort by an applier as 1213, and a node outside the primary component (joining, partitioned) as 1047.
            return RetryCause.CERTIFICATION if code == ER_LOCK_DEADLOCK else RetryCause.NODE_NOT_READY
        cause = None if code is None else self.retryable.get(code)
        # Otherwise only a connection SQLAlchemy invalidated (its own disconnect detection): a fresh one is safe.
        return cause or super().retry_cause(exc)


class MariaDBErrors(MySQLErrors):
    retryable: ClassVar[Mapping[int, RetryCause]] = {
        **MySQLErrors.retryable,
        # With innodb_snapshot_isolation=ON (default from 11.6), a locking read or write of a row committed
        # after the transaction's snapshot fails with 1020 instead of reading it: retry in a new transaction.
        ER_CHECKREAD: RetryCause.SERIALIZATION,
    }
