"""Retention: which rows `purge` deletes, and what an operator sees of the tables (`stats`): records by state, the
oldest claim still open, the backlog past retention, and each table's size where the engine reports it.

`purge` and `stats` share one definition of "past retention" (`purge_targets`), so the backlog `stats` shows is
exactly what the next `purge` would delete.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, case, func, literal_column, or_, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table

from .errors import _first_line
from .steps import Begin, Flow, sql, transaction

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from .dialects.base import Backend
    from .schema import Tables

# How long a completed record is kept for replays by default: a client retrying for longer than a day is rare, and the
# IETF Idempotency-Key draft's example window is 24 hours.
DEFAULT_RETENTION = timedelta(hours=24)


def purge_targets(tables: Tables, backend: Backend, window: timedelta) -> dict[Table, ColumnElement[bool]]:
    """Each table and the condition of its rows past `window`: records completed (or abandoned: never completed, lease
    over, created) longer ago, processed messages as old. A live in-flight claim never matches."""
    cutoff = backend.now_plus(-window.total_seconds())
    r, m = tables.records.c, tables.messages.c
    return {
        tables.records: or_(
            and_(r.completed_at.is_not(None), r.completed_at < cutoff),
            and_(r.completed_at.is_(None), r.locked_until < backend.now(), r.created_at < cutoff),
        ),
        tables.messages: m.processed_at < cutoff,
    }


@dataclass(frozen=True, slots=True)
class TableSize:
    """Bytes on disk as the engine's catalog reports them (MySQL/MariaDB: InnoDB's estimates)."""

    table_bytes: int
    index_bytes: int


@dataclass(frozen=True)
class Stats:
    """The idempotency tables at one moment of the database's clock (`db_now`).

    `in_flight` claims hold a live lease; `expired` ones were never completed and their lease is over (the holder
    died or gave up: the next use of the key takes it over, purge removes it once past retention); they are the
    *stuck* claims. `purgeable` records and `purgeable_messages` are past `retention`, waiting for `purge`."""

    retention: timedelta
    db_now: datetime
    completed: int
    in_flight: int
    expired: int
    purgeable: int
    oldest_open: datetime | None  # created_at of the oldest claim not completed (in flight or expired)
    messages: int
    purgeable_messages: int
    sizes: dict[str, TableSize | None] = field(default_factory=dict)  # by table name; None: not reported
    sizes_unavailable: str | None = None  # why the engine reported no size (e.g. a missing privilege)

    @property
    def records(self) -> int:
        return self.completed + self.in_flight + self.expired

    @property
    def oldest_open_age(self) -> timedelta | None:
        return None if self.oldest_open is None else max(timedelta(0), self.db_now - self.oldest_open)

    def as_dict(self) -> dict[str, Any]:
        """JSON-compatible: times in ISO 8601 (the database's clock, UTC), durations and ages in seconds."""
        age = self.oldest_open_age
        return {
            "retention_seconds": self.retention.total_seconds(),
            "db_now": self.db_now.isoformat(),
            "records": {"total": self.records, "completed": self.completed, "in_flight": self.in_flight,
                        "expired": self.expired, "purgeable": self.purgeable},
            "oldest_open": None if self.oldest_open is None or age is None else {
                "created_at": self.oldest_open.isoformat(), "age_seconds": age.total_seconds()},
            "messages": {"total": self.messages, "purgeable": self.purgeable_messages},
            "sizes": {name: None if size is None else {"table_bytes": size.table_bytes,
                                                       "index_bytes": size.index_bytes}
                      for name, size in self.sizes.items()},
            "sizes_unavailable": self.sizes_unavailable,
        }


def stats(tables: Tables, backend: Backend, retention: timedelta) -> Flow[Stats]:
    """The flow behind `store.stats()`: one read for the counts, one for the sizes (whose failure, e.g. a missing
    privilege on the engine's catalog, leaves the sizes out and says why). Each begins as a claim does, so SQLite
    reads without taking the write lock."""
    counts = yield from transaction(sql(lambda c: _counts(c, tables, backend, retention)), Begin.CLAIM)
    unavailable = None
    try:
        sizes = yield from transaction(sql(lambda c: {t.name: backend.table_size(c, t)
                                                      for t in (tables.records, tables.messages)}), Begin.CLAIM)
    except DBAPIError as exc:
        sizes, unavailable = {}, f"{type(exc.orig).__name__}: {_first_line(exc.orig or exc)}"
    return Stats(retention, **counts, sizes=sizes, sizes_unavailable=unavailable)


def _counts(conn: Connection, tables: Tables, backend: Backend, retention: timedelta) -> dict[str, Any]:
    past = purge_targets(tables, backend, retention)
    r, now = tables.records.c, backend.now()
    is_open = r.completed_at.is_(None)

    def count(condition: ColumnElement[bool]) -> ColumnElement[int]:
        one: ColumnElement[int] = literal_column("1")
        zero: ColumnElement[int] = literal_column("0")
        return func.coalesce(func.sum(case((condition, one), else_=zero)), zero)

    records = conn.execute(select(
        count(r.completed_at.is_not(None)).label("completed"),
        count(and_(is_open, r.locked_until > now)).label("in_flight"),
        count(and_(is_open, r.locked_until <= now)).label("expired"),
        count(past[tables.records]).label("purgeable"),
        func.min(case((is_open, r.created_at))).label("oldest_open"),
        now.label("db_now"),
    ).select_from(tables.records)).one()
    messages = conn.execute(select(func.count().label("messages"), count(past[tables.messages]).label("purgeable"))
                            .select_from(tables.messages)).one()
    return {"db_now": records.db_now, "completed": int(records.completed), "in_flight": int(records.in_flight),
            "expired": int(records.expired), "purgeable": int(records.purgeable), "oldest_open": records.oldest_open,
            "messages": int(messages.messages), "purgeable_messages": int(messages.purgeable)}
