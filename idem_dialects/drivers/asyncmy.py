"""asyncmy (``mysql+asyncmy://``, ``mariadb+asyncmy://``). Not aiomysql: 0.3.2 cannot bind bytes (the key columns)
under PyMySQL 1.2 ("'str' object is not callable")."""

from __future__ import annotations

from typing import Any

from ..sqla import driver_connection, execute_mutex, raise_as_adapter
from ..steps import Shape
from . import Driver, read_async
from .pymysql import AUTOCOMMIT, escaped_size


class Asyncmy(Driver):
    def sent_size(self, value: bytes) -> int:
        return escaped_size(value)  # an escaped string literal in the statement's text

    async def execute(self, connection: Any, sql: str, parameters: Any, shape: Shape) -> Any:
        async with execute_mutex(connection):
            try:
                async with driver_connection(connection).cursor() as cursor:
                    await cursor.execute(sql, parameters)
                    return await read_async(cursor, shape)
            except Exception as error:
                raise_as_adapter(connection, error)

    async def commit(self, connection: Any) -> None:
        """Nothing here: asyncmy's commit() sends COMMIT whatever the connection's state, so the commit SQLAlchemy
        runs next (when it gives the connection back, in the greenlet it takes for that anyway) would send a second.
        The one COMMIT is SQLAlchemy's."""


DRIVER = Asyncmy("asyncmy", "asyncmy", "idem-dialects[asyncmy]", sync=False, asynchronous=True,
                 autocommit_args=AUTOCOMMIT)
