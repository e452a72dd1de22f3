"""asyncpg (``postgresql+asyncpg://``): the store's statements on asyncpg's own connection, prepared and cached
by asyncpg per connection (none behind a transaction-mode pooler), without SQLAlchemy's greenlet per statement."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from ..sqla import asyncpg_begin, asyncpg_take_transaction, driver_connection, execute_mutex, raise_as_adapter
from ..steps import Shape
from . import Compiled, Driver
from .psycopg import session_id_is_pooled


def _unnamed_statement() -> str:
    """The statement name SQLAlchemy's asyncpg dialect prepares under: '' is PostgreSQL's unnamed statement, which
    asyncpg (its cache off) parses again with every execution, so nothing is left on any server session."""
    return ""


class Asyncpg(Driver):
    def without_prepared_statements(self, params: dict[str, Any]) -> None:
        # asyncpg's own statement cache off; SQLAlchemy's dialect prepares every statement itself: no cache there
        # either, and the unnamed statement, which lives only until the next one.
        params["statement_cache_size"] = 0
        params["prepared_statement_cache_size"] = 0
        params["prepared_statement_name_func"] = _unnamed_statement

    def behind_pooler(self, dbapi_connection: Any, driver_connection: Any) -> bool | None:
        return session_id_is_pooled(dbapi_connection, driver_connection.get_server_pid())

    async def execute(self, connection: Any, plan: Compiled, parameters: Any) -> Any:
        # `connection` is SQLAlchemy's adapter: its lock keeps one statement at a time on the connection, and its
        # transaction (BEGIN sent on first use) is the one SQLAlchemy commits.
        lock = execute_mutex(connection)
        await lock.acquire()  # not `async with`: two calls more per statement
        try:
            begin = asyncpg_begin(connection)
            if begin is not None:
                await begin
            raw = driver_connection(connection)
            shape = plan.shape
            if shape is Shape.ROW:
                return await raw.fetchrow(plan.sql, *parameters), None
            if shape is Shape.ROWS:
                return await raw.fetch(plan.sql, *parameters), None
            status = await raw.execute(plan.sql, *parameters)
        except Exception as error:
            raise_as_adapter(connection, error)
        finally:
            lock.release()
        return (int(status.rpartition(" ")[2]) if shape is Shape.ROWCOUNT else None), None

    def commit(self, connection: Any) -> Awaitable[Any] | None:
        # The adapter's transaction object, as its own commit() ends it (and forgets it whatever the outcome).
        transaction = asyncpg_take_transaction(connection)
        return None if transaction is None else transaction.commit()


DRIVER = Asyncpg("asyncpg", "asyncpg", "idem-dialects[asyncpg]", sync=False, asynchronous=True)
