"""aiosqlite (``sqlite+aiosqlite://``): sqlite3 on a thread of its own; the store's statements go straight to its
queue. Its logger at DEBUG records every statement with its parameters."""

from __future__ import annotations

import logging
from typing import Any

from ..sqla import driver_connection, raise_as_adapter, statement_lock
from ..steps import Shape
from . import Driver, read_async
from .pysqlite import AUTOCOMMIT


class Aiosqlite(Driver):
    def log_exposure(self) -> str | None:
        if not logging.getLogger("aiosqlite").isEnabledFor(logging.DEBUG):
            return None
        return ("the 'aiosqlite' logger is at DEBUG: it records every statement with its parameters, so the store's"
                " claim tokens, request fingerprints and stored responses would appear in your logs; set"
                " logging.getLogger('aiosqlite').setLevel(logging.INFO) to keep them out")

    async def execute(self, connection: Any, sql: str, parameters: Any, shape: Shape) -> Any:
        async with statement_lock(connection):
            try:
                cursor = await driver_connection(connection).execute(sql, parameters)
                try:
                    return await read_async(cursor, shape)
                finally:
                    await cursor.close()
            except Exception as error:
                raise_as_adapter(connection, error)


DRIVER = Aiosqlite("aiosqlite", "aiosqlite", "idem-dialects[aiosqlite]", sync=False, asynchronous=True,
                   autocommit_args=AUTOCOMMIT)
