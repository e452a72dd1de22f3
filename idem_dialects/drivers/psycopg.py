"""psycopg 3 (``postgresql+psycopg://``), sync and async: its async connection runs the store's statements
natively; it prepares a statement server-side after its fifth execution on a connection (never behind a
transaction-mode pooler)."""

from __future__ import annotations

from typing import Any

from ..sqla import driver_connection, raise_as_adapter
from . import Compiled, Driver, read_async


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

    async def execute(self, connection: Any, plan: Compiled, parameters: Any) -> Any:
        # psycopg's own connection lock serializes statements (SQLAlchemy's adapter takes no mutex for it either).
        raw = driver_connection(connection)
        try:
            async with raw.cursor() as cursor:
                await cursor.execute(plan.sql, parameters)
                return await read_async(cursor, plan)
        except Exception as error:
            raise_as_adapter(connection, error)


# psycopg 3 takes autocommit when connecting (sync and async).
DRIVER = Psycopg("psycopg", "psycopg", "idem-dialects[postgresql]", asynchronous=True, native=True,
                 autocommit_args={"autocommit": True})
