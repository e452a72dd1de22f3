"""psycopg 3 (``postgresql+psycopg://``), sync and async: its async connection runs the store's statements
natively; it prepares a statement server-side after its fifth execution on a connection (never behind a
transaction-mode pooler)."""

from __future__ import annotations

from typing import Any

from ..sqla import driver_connection, raise_as_adapter
from . import Compiled, Driver, read_async

# libpq's PQTRANS_IDLE and PQTRANS_INTRANS, PGRES_COMMAND_OK, PQ_PIPELINE_OFF (psycopg.pq's
# TransactionStatus, ExecStatus and PipelineStatus are IntEnums of them): read without importing psycopg here.
_IDLE, _INTRANS, _COMMAND_OK, _PIPELINE_OFF = 0, 2, 1, 0


def session_id_is_pooled(dbapi_connection: Any, told: int) -> bool:
    """True if the server session's own pid differs from the one the server named at connect (BackendKeyData): a
    pooler such as PgBouncer names a client id of its own there, since the client's sessions may change. Asked on
    a connection without prepared statements, in a transaction rolled back at once."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT pg_backend_pid()")
        own = cursor.fetchone()[0]
    finally:
        cursor.close()
    dbapi_connection.rollback()
    return bool(own != told)


class Psycopg(Driver):
    def without_prepared_statements(self, params: dict[str, Any]) -> None:
        params["prepare_threshold"] = None  # never prepare (default: after 5 executions)

    def behind_pooler(self, dbapi_connection: Any, driver_connection: Any) -> bool | None:
        return session_id_is_pooled(dbapi_connection, driver_connection.info.backend_pid)

    # psycopg sends a query and reads its answer without blocking, letting go of the GIL around each libpq call on
    # the way (about a dozen hand-offs per round trip among 8 threads: a BEGIN, a SELECT and a COMMIT took 100 µs of
    # client CPU on one thread and 350 µs each on 8). libpq's blocking PQexec lets go of it once, so the store sends
    # its transactions' BEGIN and COMMIT that way. Only a plain BEGIN: a connection with an isolation level, read_only
    # or deferrable (psycopg's BEGIN names them), in autocommit or in pipeline mode is left to psycopg.
    def begin_sync(self, dbapi_connection: Any) -> None:
        pgconn = dbapi_connection.pgconn
        if (pgconn.transaction_status == _IDLE and pgconn.pipeline_status == _PIPELINE_OFF
                and not dbapi_connection.autocommit and dbapi_connection.isolation_level is None
                and dbapi_connection.read_only is None and dbapi_connection.deferrable is None):
            _exec(dbapi_connection, b"BEGIN")

    def commit_sync(self, dbapi_connection: Any) -> None:
        # Nothing begun, a failed transaction (its COMMIT rolls back) or a pipeline: left to psycopg's commit.
        pgconn = dbapi_connection.pgconn
        if pgconn.transaction_status == _INTRANS and pgconn.pipeline_status == _PIPELINE_OFF:
            _exec(dbapi_connection, b"COMMIT")

    async def execute(self, connection: Any, plan: Compiled, parameters: Any) -> Any:
        # psycopg's own connection lock serializes statements (SQLAlchemy's adapter takes no mutex for it either).
        raw = driver_connection(connection)
        try:
            async with raw.cursor() as cursor:
                await cursor.execute(plan.sql, parameters)
                return await read_async(cursor, plan)
        except Exception as error:
            raise_as_adapter(connection, error)


def _exec(dbapi_connection: Any, command: bytes) -> None:
    """`command` by libpq's PQexec, under the connection's lock as psycopg runs its own; a failure raised as psycopg
    raises it: OperationalError on a lost connection (then `broken`, which SQLAlchemy reads as a disconnect), else
    the class its SQLSTATE names."""
    with dbapi_connection.lock:
        result = dbapi_connection.pgconn.exec_(command)
    if result.status != _COMMAND_OK:
        from psycopg import OperationalError
        from psycopg.errors import error_from_result

        encoding = dbapi_connection.info.encoding
        if dbapi_connection.broken:
            raise OperationalError(f"{command.decode()} failed: {result.get_error_message(encoding)}")
        raise error_from_result(result, encoding=encoding)


# psycopg 3 takes autocommit when connecting (sync and async).
DRIVER = Psycopg("psycopg", "psycopg", "idem-dialects[postgresql]", asynchronous=True, native=True,
                 autocommit_args={"autocommit": True})
