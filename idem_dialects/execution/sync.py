"""Executing a flow's `Exec` steps on a sync connection: natively on the DBAPI cursor under SQLAlchemy's transaction
(the default), or through SQLAlchemy's `Connection.execute` (`cursor_events=True`, and drivers whose dialect binds
through ``cursor.setinputsizes``), or on a DBAPI connection another framework owns (Django's).

Native statements skip SQLAlchemy's execution context and its cursor events: the library's own span and metrics
cover them. Their errors are still SQLAlchemy's: wrapped, told to ``handle_error`` listeners, the connection
invalidated on a disconnect, exactly as `Connection.execute` does (`sqla.handle_dbapi_exception`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ..guard import store_error
from ..sqla import handle_dbapi_exception, unlogged
from ..steps import Shape, Statement
from .plan import plan, read

if TYPE_CHECKING:
    from ..dialects.base import Backend
    from ..drivers import Driver


def execute_native(conn: Connection, backend: Backend, statement: Statement, params: Mapping[str, Any],
                   driver: Driver | None = None) -> Any:
    """Run `statement` on `conn`'s DBAPI connection, in the transaction SQLAlchemy holds on it (begun now if the
    caller's Connection had not begun one, as its autobegin would; on the DBAPI connection, `driver`'s way if it
    has a cheaper one than its own: `Driver.open_sync`, which sends the BEGIN with the statement, or
    `Driver.begin_sync`)."""
    compiled = plan(statement, conn.dialect)
    if not conn.in_transaction():
        conn.begin()
    dbapi: Any = conn.connection.dbapi_connection
    parameters = compiled.parameters(params)
    cursor: Any = None
    try:
        answer = None if driver is None else driver.open_sync(dbapi, compiled, parameters)
        if answer is None:
            cursor = dbapi.cursor()
            if driver is not None:
                driver.begin_sync(dbapi)
            cursor.execute(compiled.sql, parameters)
            answer = read(cursor, compiled)
    except BaseException as error:  # an interruption too: SQLAlchemy then invalidates the connection
        failed, cursor = cursor, None
        raise_handled(conn, backend, error, compiled.sql, statement.tables, failed, dbapi)
    finally:
        if cursor is not None:
            cursor.close()
    return compiled.result(*answer)


def commit_native(conn: Connection, backend: Backend, driver: Driver) -> None:
    """Commit the store's transaction on `conn` the driver's cheaper way (`Driver.commit_sync`): SQLAlchemy's commit,
    which follows for its bookkeeping, finds nothing left to send. An error is raised as a statement's is."""
    dbapi = conn.connection.dbapi_connection
    try:
        driver.commit_sync(dbapi)
    except BaseException as error:
        raise_handled(conn, backend, error, "COMMIT", (), None, dbapi)


def raise_handled(conn: Connection, backend: Backend, error: BaseException, sql: str, tables: Sequence[str],
                  cursor: Any, dbapi: Any) -> NoReturn:
    """Raise a native statement's `error` as `Connection.execute` would have: the driver's errors wrapped (told to
    ``handle_error`` listeners, the connection invalidated on a disconnect) and then the store's (see `store_error`);
    an exit exception after invalidating the connection; any other error as it is (a socket error a driver raises
    unwrapped, which the backend's classifier knows as a lost connection)."""
    if isinstance(error, Exception) and not isinstance(error, conn.dialect.loaded_dbapi.Error):
        raise error
    try:
        handle_dbapi_exception(conn, error, sql, cursor)
    except DBAPIError as wrapped:
        raise store_error(backend, wrapped, tables, dbapi) from wrapped.orig


def execute_sqlalchemy(conn: Connection, statement: Statement, params: Mapping[str, Any]) -> Any:
    """Run `statement` through SQLAlchemy's `Connection.execute`: its cursor events fire (OpenTelemetry's SQLAlchemy
    instrumentation sees it), kept out of the engine's log (`unlogged`)."""
    with unlogged(conn):
        result = conn.execute(statement.clause, dict(params))
        if statement.shape is Shape.ROW:
            return result.first()
        if statement.shape is Shape.ROWS:
            return result.all()
        count = result.rowcount
        result.close()
    return count if statement.shape is Shape.ROWCOUNT else None
