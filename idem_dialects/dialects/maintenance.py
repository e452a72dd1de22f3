"""A backend's maintenance part (`Backend.maintenance`): what an engine offers for keeping the record tables small and
watching them cheaply, beside the protocol's statements, as Django splits a backend's operations from its wrapper.

- **Generations**: retention by dropping a whole table instead of deleting row by row. Records live in the current
  table (`<prefix>records`); a rotation turns it into the previous one (`<prefix>records_prev`) and drops the
  previous one, carrying forward the few rows still within retention and every claim not completed, so a claim not
  completed is always in the current table (complete, release, renew and takeover never look elsewhere). A claim
  reads the previous table before it inserts into the current one: that table changes only in a rotation, which
  takes each engine's exclusive table lock and so waits for every claim that touched them.
- **Estimates**: what the engine keeps about a table (catalog row counts, the planner's estimate of a range, its size
  on disk), so `stats` answers in constant time on a table of any size; and whether those statistics are **stale**
  (many rows written since the engine last gathered them), so `stats` counts what it can count on an index, or says
  which figure it could not, rather than report a guess as a figure.

The portable default offers none: exact counts, no sizes, and purge deletes row by row (small installations, and
engines where that is the only way). Engine-specific SQL lives in each engine's `<engine>_maintenance.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Table, func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import Select

from ..features import Features


class Maintained(Protocol):
    """What a maintenance part reads of its backend (the backend itself: `base.py` imports this module)."""

    @property
    def name(self) -> str: ...

    engine: Engine
    features: Features

    def now_plus(self, seconds: float) -> ColumnElement[datetime]: ...


class Maintenance:
    """The portable default: no generations, no estimates, no sizes."""

    def __init__(self, backend: Maintained) -> None:
        self.backend = backend

    def generations(self) -> bool:
        """Whether a rotation works on this database (the features refined from the live server may say no, e.g. a
        Galera node, where table locks are not replicated)."""
        return False

    def rotate(self, conn: Connection, current: Table, previous: Table, staging: Table,
               keep: ColumnElement[bool], attempt: int = 0) -> int:
        """Drop the previous generation whole: its rows matching `keep` (within retention; found on the completion
        index, never by reading the whole generation) carried into the current table first, the current table then
        made the previous one and a new current one created, claims not completed moved into it. Runs in the
        transaction of `conn` (a schema step); returns how many rows were dropped, counted (`dropping`) before the
        lock is taken: only a rotation changes the previous table, so the count holds until the drop.

        Everything that can be done before the tables' exclusive lock is (the count, the new table, the rows carried
        forward): claims wait only for the lock and the renames. The lock's wait is bounded by `rotation_wait(attempt)`
        (then the engine's lock timeout, which the purge retries with the next attempt): claims queue behind a waiting
        rotation, so a first attempt waits little, and only a rotation that keeps meeting a long transaction waits
        longer."""
        raise NotImplementedError(f"{self.backend.name}: no generations on this backend")

    def drop_retired(self, conn: Connection, previous: Table) -> None:
        """Drop the generation `rotate` renamed away (`retired_name(previous)`), once the rotation has committed: no
        claim touches it any more, so its cost is no wait of theirs."""
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {conn.dialect.identifier_preparer.quote(retired_name(previous))}")

    def rows(self, conn: Connection, table: Table) -> int | None:
        """The engine's estimate of the rows in `table` (catalog statistics), or None if it keeps none."""
        return None

    def older_than(self, conn: Connection, table: Table, column: str, seconds: float) -> int | None:
        """The planner's estimate of the rows of `table` whose `column` is more than `seconds` before the database's
        clock, or None if the engine gives none it can stand behind: `stats` then counts the range on its index, or,
        where the column has none, takes the whole table as the bound."""
        return None

    def count_older_than(self, conn: Connection, table: Table, column: str, seconds: float) -> int:
        """The rows of `table` whose `column` is more than `seconds` before the database's clock, counted on the
        column's index (a range: it costs what it holds, not the table's size), where `older_than` has no estimate to
        trust."""
        cutoff = self.backend.now_plus(-seconds)
        return int(conn.execute(select(func.count()).select_from(table).where(table.c[column] < cutoff)).scalar_one())

    def stale(self, conn: Connection, table: Table) -> bool:
        """Whether the statistics behind `older_than` for `table` are stale: so many rows written since the engine
        last gathered them (a bulk load, autovacuum not keeping up, statistics of the table while it was empty) that
        its estimate may be anything. `stats` then counts the range on the index, or marks the figure stale. The
        portable default keeps no statistics, so nothing of it is stale."""
        return False

    def key_range(self, columns: Sequence[ColumnElement[Any]], values: Sequence[ColumnElement[Any]],
                  op: str) -> ColumnElement[bool] | None:
        """`(columns) op (values)`, `op` ">" or "<=", spelled so that the engine's optimizer reads it as a range of
        the index on `columns`; or None, the portable default: no need. Purge walks the completion index range by
        range (`purging.Walk`); where more records than a batch share one completion time (a bulk load), each batch
        begins at that time again and steps over the index entries the ones before it deleted. Where stepping over
        them is costly (InnoDB locks each one's row to read it: batches 2-3x slower), the walk goes through such a
        group by primary key instead, with this comparison. PostgreSQL marks a dead entry on its first visit and
        skips it cheaply after; SQLite removes entries at once."""
        return None

    def in_key_order(self, query: Select[Any], table: Table) -> Select[Any]:
        """`query`, a SELECT of `table`'s rows in a range of its primary key and in its order (`key_range`), made to
        read them from the primary key: purge's key walk. The portable default leaves the choice to the optimizer."""
        return query

    def size_statement(self, table: Table) -> Executable | None:
        """A statement giving one row (table bytes, index bytes) for `table` from the engine's catalog, or None if the
        engine reports no sizes. Table bytes include the table's LOB/TOAST storage; index bytes every index's."""
        return None


# A rotation's wait for the tables' exclusive lock, attempt by attempt: every claim that arrives meanwhile queues behind
# it, so the first attempts wait little (the claims in flight finish in milliseconds), and the wait doubles only while
# a longer transaction holds the tables, up to ROTATION_LAST_WAIT (what it always was).
ROTATION_FIRST_WAIT = 0.05
ROTATION_LAST_WAIT = 10.0


def rotation_wait(attempt: int, floor: float = ROTATION_FIRST_WAIT) -> float:
    """Seconds attempt `attempt` (from 0) of a rotation waits for its lock, at least `floor` (the engine's unit)."""
    return float(min(ROTATION_LAST_WAIT, max(floor, ROTATION_FIRST_WAIT * 2 ** min(attempt, 16))))


def retired_name(previous: Table) -> str:
    """The name a rotation gives the generation it retires, until `drop_retired` drops it."""
    return f"{previous.name}_old"


def exact_count(conn: Connection, table: Table) -> int:
    return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def dropping(conn: Connection, table: Table) -> int:
    """How many rows dropping the previous generation `table` removes (those `carried` forward aside): counted,
    whatever its size, so that `purge` reports rows removed and never the engine's estimate (which after a bulk of
    writes with no ANALYZE can be far off). Run before the rotation takes its lock: no claim, completion, release,
    renewal or takeover writes the previous table (claims insert into the current one and only read this one), only a
    rotation changes it, so the count is still right when the lock is held (two purges rotating at once aside), and
    the lock is held no longer for it."""
    return exact_count(conn, table)


def carried(conn: Connection, table: Table, keep: ColumnElement[bool]) -> int:
    """How many rows of the previous generation `table` a rotation carries forward (`keep`, a range of the completion
    index and its NULLs): counted in the table, as `dropping` is, not as the copy's row count, which misses the rows
    an attempt before copied (the copy ignores a key already there)."""
    return int(conn.execute(select(func.count()).select_from(table).where(keep)).scalar_one())


def carried_columns(table: Table) -> list[str]:
    return [c.name for c in table.c]
