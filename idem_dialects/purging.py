"""How `purge` deletes row by row beside traffic: paced batches (`Pacer`), and the completed records walked in the
completion index's order, one contiguous range per batch (`Walk`). Engine-neutral: each DELETE is the backend's own
`purge_batch`; what is added here is a narrower condition (a range's edges) and the time between batches.

Why: an unpaced purge took a whole core of the server for as long as it ran (claims beside it kept 40-63% of their
rate), and a batch that scans its table or index from the start steps over every row the batches before it deleted
(dead row versions and index entries, until the engine's vacuum or purge removes them), each batch more of them:
docs/operations/purge.md has the figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, literal_column, select, type_coerce
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table
from sqlalchemy.types import NullType

from .dialects.base import Backend
from .steps import Flow, Shape, Sleep, Statement, execute

# How long one purge batch's transaction should take: a batch slower than this (a loaded server) is followed by a
# smaller one, down to MIN_BATCH rows, so the locks it holds and the undo it leaves stay short; a batch faster than
# half of it lets the size grow back, doubling, up to `batch_size`.
BATCH_SECONDS = 0.1
MIN_BATCH = 16


class Pacer:
    """How many rows the next batch may take, and how long to wait after each.

    The pause after a batch that took t seconds is t (1/pace - 1), so batches fill at most `pace` of the purge's time
    whatever the server's load: a busy server makes batches slower and the pauses longer with them. A batch slower
    than BATCH_SECONDS halves the next one (down to MIN_BATCH), one faster than half of it doubles it back (up to
    `most`): transactions stay short under load, and the sizes few (each is a statement compiled once)."""

    def __init__(self, most: int, pace: float) -> None:
        self.most, self.pace, self.size = most, pace, most

    def pause(self, took: float) -> Flow[None]:
        if took > BATCH_SECONDS and self.size > MIN_BATCH:
            self.size = max(MIN_BATCH, self.size // 2)
        elif took < BATCH_SECONDS / 2 and self.size < self.most:
            self.size = min(self.most, self.size * 2)
        if self.pace < 1:
            yield Sleep(took * (1 / self.pace - 1))


@dataclass(frozen=True, slots=True)
class Position:
    """Where a walk is: from `at` on (None: the start), `at` itself included unless `past`; inside a group of rows
    sharing `at` (`tie`), after `key` (None: from the group's first key)."""

    at: Any = None
    past: bool = False
    tie: bool = False
    key: tuple[Any, ...] | None = None


START = Position()


class Walk:
    """The rows of `table` matching `condition` deleted in `column`'s order (its index's), each batch one contiguous
    range `[start, end]` of it: `end` found by an index-only read `size` rows on from `start`, the next batch starting
    at `end`. No batch steps over what the batches before it deleted.

    Where more rows than a batch share one value of `column` (a bulk load stamps its rows with one time), a batch
    would begin at that value again and again, stepping over the ones already deleted. Where that costs (the engine's
    maintenance spells a key range, `Maintenance.key_range`: MySQL and MariaDB, whose InnoDB locks the row of each
    deleted entry it steps over), the walk goes through such a group by primary key instead (ranges of the key, found
    the same way), then on past the value; elsewhere the batches take the group a range [value, value] at a time.

    Each DELETE is the backend's `purge_batch` under `condition` as ever (a range only narrows it), so what it removes
    matches `condition` whatever the range says. Values come back and are bound as the driver gives them (SQLite keeps
    times as text, MySQL keys as bytes), so a range's edges are the stored values themselves, compared as stored."""

    def __init__(self, backend: Backend, table: Table, column: str, condition: ColumnElement[bool]) -> None:
        self.backend, self.table, self.condition = backend, table, condition
        self.column = table.c[column]
        self.time = type_coerce(self.column, NullType())
        self.pk = [type_coerce(c, NullType()) for c in table.primary_key.columns]
        self.start = bindparam("purge_start", type_=NullType())
        self.end = bindparam("purge_end", type_=NullType())
        self.after = [bindparam(f"purge_after_{i}", type_=NullType()) for i in range(len(self.pk))]
        self.upto = [bindparam(f"purge_upto_{i}", type_=NullType()) for i in range(len(self.pk))]
        self._conditions: dict[tuple[Any, ...], ColumnElement[bool]] = {}
        # Whether a group sharing one value is walked by key (where the engine says stepping over deleted entries
        # costs: `Maintenance.key_range`).
        self.keyed = backend.maintenance.key_range(self.pk, self.after, ">") is not None

    def step(self, position: Position, size: int) -> Flow[tuple[int, Position | None]]:
        """One batch (run in one transaction): the rows it deleted, and where the next one begins (None: none left
        from here on, the walk is over)."""
        if position.tie:
            return (yield from self._in_tie(position, size))
        lower = None if position.at is None else ">" if position.past else ">="
        values = {} if position.at is None else {"purge_start": position.at}
        found = yield from execute(self._edge(lower, size), values)
        if found is None:  # fewer than `size` rows left: all of them
            return (yield from self._delete(("time", lower, False), size, values)), None
        edge = found[0]
        if lower == ">=" and edge == position.at and self.keyed:  # the next `size` rows share `at`: by key
            return (yield from self._in_tie(Position(edge, tie=True), size))
        deleted = yield from self._delete(("time", lower, True), size, values | {"purge_end": edge})
        return deleted, Position(edge)

    def _in_tie(self, position: Position, size: int) -> Flow[tuple[int, Position | None]]:
        values = {"purge_start": position.at}
        if position.key is not None:
            values |= {b.key: v for b, v in zip(self.after, position.key, strict=True)}
        keyed = position.key is not None
        found = yield from execute(self._key_edge(keyed, size), values)
        if found is None:  # the group's last rows: then on past its value
            return (yield from self._delete(("tie", keyed, False), size, values)), Position(position.at, past=True)
        edge = tuple(found)
        values |= {b.key: v for b, v in zip(self.upto, edge, strict=True)}
        deleted = yield from self._delete(("tie", keyed, True), size, values)
        return deleted, Position(position.at, tie=True, key=edge)

    def _delete(self, shape: tuple[Any, ...], size: int, values: dict[str, Any]) -> Flow[int]:
        return (yield from self.backend.purge_batch(self.table, self._where(shape), size, values))

    def _where(self, shape: tuple[Any, ...]) -> ColumnElement[bool]:
        """The condition of one shape of batch (built once per walk, so each shape is one statement compiled once):
        ("time", lower, upper) a range of the column, ("tie", keyed, upper) a range of keys at one value of it."""
        found = self._conditions.get(shape)
        if found is None:
            kind, first, upper = shape
            parts = [self.condition]
            if kind == "time":
                if first is not None:
                    parts.append(self.time > self.start if first == ">" else self.time >= self.start)
                if upper:
                    parts.append(self.time <= self.end)
            else:
                parts.append(self.time == self.start)
                for wanted, binds, op in ((first, self.after, ">"), (upper, self.upto, "<=")):
                    comparison = self.backend.maintenance.key_range(self.pk, binds, op) if wanted else None
                    if comparison is not None:
                        parts.append(comparison)
            found = self._conditions[shape] = and_(*parts)
        return found

    def _edge(self, lower: str | None, size: int) -> Statement:
        return self._nth(("edge", lower, size), [self.time], self._where(("time", lower, False)), [self.column],
                         size)

    def _key_edge(self, keyed: bool, size: int) -> Statement:
        return self._nth(("key edge", keyed, size), self.pk, self._where(("tie", keyed, False)),
                         list(self.table.primary_key.columns), size, by_key=True)

    def _nth(self, name: tuple[Any, ...], columns: Sequence[ColumnElement[Any]], where: ColumnElement[bool],
             order: Sequence[Any], size: int, by_key: bool = False) -> Statement:
        """The `size`-th row's `columns` by `order` among those matching `where`: an index-only read of as many
        entries. LIMIT and OFFSET are written into the text: rendered as parameters at compile time (as SQL Server's
        and Oracle's are), they would need the range's own parameters, which only a batch has."""
        def build() -> Statement:
            query = (select(*(c.label(f"c{i}") for i, c in enumerate(columns))).where(where).order_by(*order)
                     .limit(literal_column("1")).offset(literal_column(str(int(size) - 1))))
            if by_key:
                query = self.backend.maintenance.in_key_order(query, self.table)
            return Statement(query, Shape.ROW, (self.table.name,))

        return self.backend.prepared(("purge", self.table, self.condition, *name), build)

