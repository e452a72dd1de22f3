"""Retention: which rows `purge` deletes, and what an operator sees of the tables (`stats`): records by state, the
oldest claim still open, the backlog past retention, and each table's size where the engine reports it.

`purge` and `stats` share one definition of "past retention" (`purge_targets`), so the backlog `stats` shows is
exactly what the next `purge` would delete.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, literal_column, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table

from .core import Core
from .dialects.base import Backend
from .dialects.maintenance import Maintenance
from .errors import _first_line
from .limits import DEFAULT_PACE, DEFAULT_RETENTION, check_batch_size, check_pace, check_retention
from .purging import START, Pacer, Position, Walk
from .schema import PUBLISHED, Tables
from .steps import Begin, Flow, Shape, Statement, catalog, execute, transaction

__all__ = ["DEFAULT_PACE", "DEFAULT_RETENTION", "Retention", "Stats", "TableSize", "purge_targets"]
# Below this many rows (the engine's estimate) `stats` counts exactly: a scan that small costs less than a
# millisecond or so, and the planner's guesses on small or fresh tables are rough.
EXACT_BELOW = 100_000


def purge_targets(tables: Tables, backend: Backend, window: timedelta) -> dict[Table, ColumnElement[bool]]:
    """Each table and the condition of its rows past `window`: records completed (or abandoned: never completed, lease
    over, created) longer ago, processed messages as old, outbox commands published as long ago (pending and
    dead-lettered commands stay). A live in-flight claim never matches."""
    cutoff = backend.now_plus(-window.total_seconds())
    return {tables.records: past_retention(tables.records, backend, window),
            tables.messages: tables.messages.c.processed_at < cutoff,
            tables.outbox: and_(tables.outbox.c.state == PUBLISHED, tables.outbox.c.available_at < cutoff)}


def past_retention(records: Table, backend: Backend, window: timedelta) -> ColumnElement[bool]:
    """The rows of a records table (the current generation or the previous one) past `window`."""
    return or_(completed_past(records, backend, window), abandoned_past(records, backend, window))


def completed_past(records: Table, backend: Backend, window: timedelta) -> ColumnElement[bool]:
    """The completed records past `window`: a range of the completion index, which purge walks in order."""
    r = records.c
    return and_(r.completed_at.is_not(None), r.completed_at < backend.now_plus(-window.total_seconds()))


def abandoned_past(records: Table, backend: Backend, window: timedelta) -> ColumnElement[bool]:
    """The claims never completed whose lease is over and which were created longer than `window` ago: among the
    completion index's NULLs (few: in flight or stuck), never a live in-flight claim."""
    r = records.c
    return and_(r.completed_at.is_(None), r.locked_until < backend.now(),
                r.created_at < backend.now_plus(-window.total_seconds()))


def within_retention(records: Table, backend: Backend, window: timedelta) -> ColumnElement[bool]:
    """The rows of a records table `past_retention` leaves, written so that the completion index finds them (a range
    and its NULLs): what a rotation carries forward, without reading the generation it drops."""
    cutoff = backend.now_plus(-window.total_seconds())
    r = records.c
    return or_(r.completed_at >= cutoff,
               and_(r.completed_at.is_(None), or_(r.locked_until >= backend.now(), r.created_at >= cutoff)))


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
    # The figures that are the engine's estimates, not counts (where it keeps them: catalog statistics, the planner's
    # estimate of a range): "records", "completed", "purgeable", "messages", "purgeable_messages". Claims not
    # completed (in_flight, expired, oldest_open) are always counted, on the completion index's NULLs.
    estimated: tuple[str, ...] = ()
    # The estimated figures whose engine statistics are stale (many rows written since they were gathered): possibly
    # far off, and not counted because only a whole-table scan could. The records' backlog is never among them: where
    # its estimate is stale or the engine has none to trust, it is counted on the completion index.
    stale: tuple[str, ...] = ()
    shards: dict[str, Stats] = field(default_factory=dict)  # a sharded store's: each shard's own, by shard id

    @classmethod
    def combined(cls, by_shard: Mapping[str, Stats]) -> Stats:
        """A sharded store's tables as one: counts summed, the oldest open claim of any shard (its age on its own
        shard's clock), each size under "shard/table", and every shard's own figures in `shards`."""
        parts = list(by_shard.values())
        oldest = max(parts, key=lambda p: p.oldest_open_age or timedelta(-1))
        return cls(
            retention=parts[0].retention, db_now=oldest.db_now,
            completed=sum(p.completed for p in parts), in_flight=sum(p.in_flight for p in parts),
            expired=sum(p.expired for p in parts), purgeable=sum(p.purgeable for p in parts),
            oldest_open=oldest.oldest_open, messages=sum(p.messages for p in parts),
            purgeable_messages=sum(p.purgeable_messages for p in parts),
            sizes={f"{shard}/{name}": size for shard, p in by_shard.items() for name, size in p.sizes.items()},
            sizes_unavailable="; ".join(f"{shard}: {p.sizes_unavailable}" for shard, p in by_shard.items()
                                        if p.sizes_unavailable) or None,
            estimated=tuple(sorted({name for p in parts for name in p.estimated})),
            stale=tuple(sorted({name for p in parts for name in p.stale})),
            shards=dict(by_shard))

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
            "estimated": list(self.estimated),
            "stale": list(self.stale),
            **({"shards": {shard: part.as_dict() for shard, part in self.shards.items()}} if self.shards else {}),
        }


def _utc(moment: datetime) -> datetime:
    """A database time as an aware UTC datetime: engines that keep no zone (SQLite, MySQL) store UTC, those that do
    (PostgreSQL's timestamptz) answer in the session's zone. One form everywhere, so `stats --format json` reads
    the same on every engine."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class Retention:
    """The retention flows on one store's `Core`."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
              progress: Callable[[str, int], None] | None = None, pace: float = DEFAULT_PACE) -> Flow[int]:
        """Delete records completed (or abandoned, lease over) longer than `older_than` (default: the retention)
        ago, processed messages and published outbox commands as old, in batches of one transaction each (at most
        `batch_size` rows, fewer while batches take longer than BATCH_SECONDS), each retried like `run`, with a pause
        after each batch that keeps the time spent in batches to `pace` of the whole (1: no pauses). A live in-flight
        claim is never touched. `progress(table, deleted)` is called after each batch. Validates eagerly."""
        window = self.core.retention if older_than is None else check_retention(older_than, "older_than")
        check_batch_size(batch_size)
        return self._purge(purge_targets(self.core.tables, self.core.backend, window), Pacer(batch_size,
                                                                                              check_pace(pace)),
                           progress, window)

    def _generations(self) -> Flow[bool]:
        return self.core.previous is not None  # found when the transaction began (`Core.refine`)
        yield  # pragma: no cover - a flow

    def _rotate(self, keep: ColumnElement[bool], window: timedelta,
                progress: Callable[[str, int], None] | None) -> Flow[int]:
        """Drop the previous generation if every record in it is past `window` (its newest completion older), else
        nothing: one statement on its completion index decides."""
        tables, backend = self.core.tables, self.core.backend
        previous = tables.previous
        # The newest completion on the index, one entry read (NULL: nothing completed there, nothing to keep).
        newest = select(func.max(previous.c.completed_at) >= backend.now_plus(-window.total_seconds()))
        recent = yield from transaction(execute(Statement(newest, Shape.ROW, (previous.name,))), Begin.CLAIM)
        if recent[0]:
            return 0
        attempts = [0]

        def rotate(conn: Connection) -> int:
            # Each attempt waits longer for the tables' lock than the one before (`rotation_wait`): claims queue
            # behind a waiting rotation, so the first waits only for the claims in flight.
            attempt, attempts[0] = attempts[0], attempts[0] + 1
            return backend.maintenance.rotate(conn, tables.records, previous, tables.staging, keep, attempt)

        dropped: int = yield from self.core.retrying(lambda: transaction(catalog(rotate)))
        yield from self.core.retrying(lambda: transaction(catalog(
            lambda conn: backend.maintenance.drop_retired(conn, previous))))
        self.core.telemetry.purged(tables.records.name, dropped)
        if progress is not None:
            progress(previous.name, dropped)
        return dropped

    def _purge(self, targets: dict[Table, ColumnElement[bool]], pacer: Pacer,
               progress: Callable[[str, int], None] | None, window: timedelta) -> Flow[int]:
        total = 0
        tables, backend = self.core.tables, self.core.backend
        records = tables.records
        if (yield from transaction(self._generations(), Begin.CLAIM)):
            # Generations: the previous one is dropped whole once every record in it is past retention; until then
            # there is nothing to drop (records are kept between one and two retention windows).
            targets = {t: c for t, c in targets.items() if t is not records}
            total += yield from self._rotate(within_retention(tables.previous, backend, window), window, progress)
        for table, condition in targets.items():
            if table is records:
                # The completed records in the completion index's order, range by range; then the abandoned claims
                # (its NULLs, few). Together they are `condition`: what `stats` counts as past retention.
                total += yield from self._in_order(records, "completed_at", completed_past(records, backend, window),
                                                   pacer, progress)
                condition = abandoned_past(records, backend, window)
            total += yield from self._batches(table, condition, pacer, progress)
        return total

    def _batches(self, table: Table, condition: ColumnElement[bool], pacer: Pacer,
                 progress: Callable[[str, int], None] | None) -> Flow[int]:
        """Batches of the backend's `purge_batch` until one deletes fewer rows than it was allowed."""
        total = 0
        while True:
            size = pacer.size

            def batch(size: int = size) -> Flow[int]:
                return transaction(self.core.backend.purge_batch(table, condition, size), Begin.PURGE)

            started = time.monotonic()
            deleted = yield from self.core.retrying(batch)
            total += yield from self._done(table, deleted, progress)
            if deleted < size:
                return total
            yield from pacer.pause(time.monotonic() - started)

    def _in_order(self, table: Table, column: str, condition: ColumnElement[bool], pacer: Pacer,
                  progress: Callable[[str, int], None] | None) -> Flow[int]:
        """The rows matching `condition` in `column`'s order, one contiguous range per batch (`purging.Walk`)."""
        walk, total = Walk(self.core.backend, table, column, condition), 0
        position: Position | None = START
        while position is not None:
            size = pacer.size

            def batch(at: Position = position, size: int = size) -> Flow[tuple[int, Position | None]]:
                return transaction(walk.step(at, size), Begin.PURGE)

            started = time.monotonic()
            deleted, after = yield from self.core.retrying(batch)
            total += yield from self._done(table, deleted, progress)
            if deleted == 0 and after == position:
                # A range that deleted nothing and leads back to itself: its rows are another purge's (PostgreSQL
                # skips rows another transaction holds), or a driver reads the column coarser than the engine keeps
                # it (SQL Server's 100 ns, read as microseconds). What is left goes in batches, the way it always did.
                return total + (yield from self._batches(table, condition, pacer, progress))
            position = after
            if position is not None:
                yield from pacer.pause(time.monotonic() - started)
        return total

    def _done(self, table: Table, deleted: int, progress: Callable[[str, int], None] | None) -> Flow[int]:
        self.core.telemetry.purged(table.name, deleted)
        if progress is not None:
            progress(table.name, deleted)
        return deleted
        yield  # pragma: no cover - a flow

    def stats(self) -> Flow[Stats]:
        """Records by state, the backlog past the retention, table sizes: one read for the counts, one for the sizes
        (whose failure, e.g. a missing privilege on the engine's catalog, leaves the sizes out and says why). Each
        begins as a claim does, so SQLite reads without taking the write lock."""
        counts = yield from transaction(self._counts(), Begin.CLAIM)
        unavailable = None
        try:
            sizes = yield from transaction(self._sizes(), Begin.CLAIM)
        except DBAPIError as exc:
            sizes, unavailable = {}, f"{type(exc.orig).__name__}: {_first_line(exc.orig or exc)}"
        return Stats(self.core.retention, **counts, sizes=sizes, sizes_unavailable=unavailable)

    def _counts(self) -> Flow[dict[str, Any]]:
        maintenance = self.core.backend.maintenance
        if type(maintenance).rows is not Maintenance.rows:
            counted = (self.core.tables.records, self.core.tables.messages, *self._previous())
            rows = yield from catalog(lambda conn: sum(max(0, maintenance.rows(conn, t) or 0) for t in counted))
            if rows >= EXACT_BELOW:
                return (yield from self._estimates())
        tables, backend = self.core.tables, self.core.backend
        past = purge_targets(tables, backend, self.core.retention)
        r, now = tables.records.c, backend.now()
        is_open = r.completed_at.is_(None)

        def count(condition: ColumnElement[bool]) -> ColumnElement[int]:
            one: ColumnElement[int] = literal_column("1")
            zero: ColumnElement[int] = literal_column("0")
            return func.coalesce(func.sum(case((condition, one), else_=zero)), zero)

        records = yield from execute(Statement(select(
            count(r.completed_at.is_not(None)).label("completed"),
            count(and_(is_open, r.locked_until > now)).label("in_flight"),
            count(and_(is_open, r.locked_until <= now)).label("expired"),
            count(past[tables.records]).label("purgeable"),
            func.min(case((is_open, r.created_at))).label("oldest_open"),
            now.label("db_now"),
        ).select_from(tables.records), Shape.ROW, (tables.records.name,)))
        messages = yield from execute(Statement(
            select(func.count().label("messages"), count(past[tables.messages]).label("purgeable"))
            .select_from(tables.messages), Shape.ROW, (tables.messages.name,)))
        completed, purgeable = int(records.completed), int(records.purgeable)
        for previous in self._previous():  # completed records only: a rotation carries the others forward
            row = yield from execute(Statement(select(
                count(previous.c.completed_at.is_not(None)),
                count(past_retention(previous, backend, self.core.retention))).select_from(previous), Shape.ROW,
                (previous.name,)))
            completed, purgeable = completed + int(row[0]), purgeable + int(row[1])
        return {"db_now": _utc(records.db_now), "completed": completed,
                "in_flight": int(records.in_flight), "expired": int(records.expired), "purgeable": purgeable,
                "oldest_open": None if records.oldest_open is None else _utc(records.oldest_open),
                "messages": int(messages.messages), "purgeable_messages": int(messages.purgeable)}

    def _estimates(self) -> Flow[dict[str, Any]]:
        """What the engine keeps, in constant time whatever the tables' size: the claims not completed counted on the
        completion index's NULLs (few: in flight or stuck), everything else the engine's estimates, but for the
        records past retention where the engine has no estimate to trust (none, or from stale statistics): those are
        counted on the completion index, a range that costs what it holds, and the figure `--fail-on-backlog` needs."""
        tables, backend, core = self.core.tables, self.core.backend, self.core
        maintenance, seconds = backend.maintenance, core.retention.total_seconds()
        r, now = tables.records.c, backend.now()
        past = past_retention(tables.records, backend, core.retention)
        one: ColumnElement[int] = literal_column("1")
        open_rows = yield from execute(Statement(select(
            func.count(case((r.locked_until > now, one))).label("in_flight"),
            func.count(case((r.locked_until <= now, one))).label("expired"),
            func.count(case((past, one))).label("abandoned"),
            func.min(r.created_at).label("oldest_open"), now.label("db_now"),
        ).where(r.completed_at.is_(None)), Shape.ROW, (tables.records.name,)))
        generations = [tables.records, *self._previous()]

        def known(n: int | None) -> int:
            return max(0, n or 0)

        def estimate(conn: Connection) -> dict[str, Any]:
            past, guessed = 0, False
            for table in generations:
                guess = None if maintenance.stale(conn, table) else \
                    maintenance.older_than(conn, table, "completed_at", seconds)
                if guess is None:  # completed before the cutoff: a range on the completion index
                    past += maintenance.count_older_than(conn, table, "completed_at", seconds)
                else:
                    past, guessed = past + known(guess), True
            return {"records": sum(known(maintenance.rows(conn, t)) for t in generations),
                    "past": past, "guessed": guessed,
                    "messages": known(maintenance.rows(conn, tables.messages)),
                    "past_messages": maintenance.older_than(conn, tables.messages, "processed_at", seconds),
                    "messages_stale": maintenance.stale(conn, tables.messages)}

        found = yield from catalog(estimate)
        purgeable, guessed = int(open_rows.abandoned) + found["past"], found["guessed"]
        in_flight, expired, messages = int(open_rows.in_flight), int(open_rows.expired), found["messages"]
        # No estimate of the messages past retention (no index on processed_at to count on): all of them, a bound.
        past_messages = messages if found["past_messages"] is None else min(known(found["past_messages"]), messages)
        stale = ("purgeable_messages",) if found["messages_stale"] and found["past_messages"] is not None else ()
        return {"db_now": _utc(open_rows.db_now), "completed": max(0, found["records"] - in_flight - expired),
                "in_flight": in_flight, "expired": expired, "purgeable": purgeable,
                "oldest_open": None if open_rows.oldest_open is None else _utc(open_rows.oldest_open),
                "messages": messages, "purgeable_messages": past_messages,
                "estimated": ("records", "completed", *(("purgeable",) if guessed else ()), "messages",
                              "purgeable_messages"),
                "stale": stale}

    def _previous(self) -> list[Table]:
        return [] if self.core.previous is None else [self.core.previous]

    def _sizes(self) -> Flow[dict[str, TableSize | None]]:
        sizes: dict[str, TableSize | None] = {}
        for table in (self.core.tables.records, *self._previous(), self.core.tables.messages):
            clause = self.core.backend.maintenance.size_statement(table)
            row = None if clause is None else (yield from execute(Statement(clause, Shape.ROW)))
            sizes[table.name] = None if row is None or row[0] is None else TableSize(int(row[0]), int(row[1] or 0))
        return sizes
