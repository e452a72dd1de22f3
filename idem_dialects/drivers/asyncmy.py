"""asyncmy (``mysql+asyncmy://``, ``mariadb+asyncmy://``). Not aiomysql: 0.3.2 cannot bind bytes (the key columns)
under PyMySQL 1.2 ("'str' object is not callable")."""

from __future__ import annotations

from typing import Any

from ..sqla import driver_connection, execute_mutex, raise_as_adapter
from . import Compiled, Driver, read_async
from .pymysql import AUTOCOMMIT, escaped_size


class Asyncmy(Driver):
    # asyncmy's commit() sends COMMIT whatever the connection's state, so the commit SQLAlchemy runs when it gives
    # the connection back (in the greenlet it takes for that anyway) would send a second: the one COMMIT is that one.
    commits_natively = False

    def sent_size(self, value: bytes) -> int:
        return escaped_size(value)  # an escaped string literal in the statement's text

    async def execute(self, connection: Any, plan: Compiled, parameters: Any) -> Any:
        lock = execute_mutex(connection)
        await lock.acquire()  # not `async with`: two calls more per statement
        try:
            async with driver_connection(connection).cursor() as cursor:
                await cursor.execute(plan.sql, parameters)
                return await read_async(cursor, plan)
        except Exception as error:
            raise_as_adapter(connection, error)
        finally:
            lock.release()


DRIVER = Asyncmy("asyncmy", "asyncmy", "idem-dialects[asyncmy]", sync=False, asynchronous=True,
                 autocommit_args=AUTOCOMMIT)
