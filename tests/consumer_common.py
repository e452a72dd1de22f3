"""What the broker adapters' tests share: a store on an SQLite file (sync and async URLs of one database) with a table
counting committed handler runs, and waiting for a condition with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.engine import Connection

from idem_dialects import IdempotencyStore
from idem_dialects.conformance.brokers import applied_table


def dead_lettered(queue: str) -> Any:
    """A Celery queue whose rejected messages go to `<queue>.dead` (the worker and the client declare it alike)."""
    from kombu import Queue

    return Queue(queue, queue_arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{queue}.dead"})


class Inbox:
    """An IdempotencyStore on `tmp_path`/inbox.db and its `<prefix>applied` table (one row per committed run)."""

    prefix = "inbox_"

    def __init__(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path / 'inbox.db'}"
        self.async_url = f"sqlite+aiosqlite:///{tmp_path / 'inbox.db'}"
        self.store = IdempotencyStore.from_url(self.url, table_prefix=self.prefix)
        self.store.create_tables()
        self.table = applied_table(self.prefix)
        self.table.create(self.store.engine)

    def apply(self, conn: Connection, message_id: str) -> str:
        conn.execute(insert(self.table).values(message_id=message_id, worker=0))
        return message_id

    def applied(self) -> dict[str, int]:
        with self.store.engine.connect() as conn:
            rows = conn.execute(select(self.table.c.message_id, func.count()).group_by(self.table.c.message_id))
            return {str(mid): int(n) for mid, n in rows}

    def close(self) -> None:
        self.store.close()


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


async def await_for(condition: Callable[[], Any | Awaitable[Any]], timeout: float = 30.0,
                    what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)
