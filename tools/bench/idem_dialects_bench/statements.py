"""What a request sends, by statement: the store's own statements and the effect's, and driver-level commits (what
reaches the wire, round trips included, is counted on it: `wire`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event


@dataclass
class StatementLog:
    """SQL a request sent: the store's own statements (through a `Recorder`: the store runs them on the driver, out
    of SQLAlchemy's sight) and the effect's, through SQLAlchemy's cursors; and driver-level commits."""

    statements: list[str] = field(default_factory=list)
    commits: int = 0

    @property
    def kinds(self) -> list[str]:
        return [statement_kind(s) for s in self.statements]


class Recorder:
    """A store's `statement_hook`: it feeds the store's statements to the log `record_statements` holds now."""

    def __init__(self) -> None:
        self.log: StatementLog | None = None

    def __call__(self, sql: str, done: bool) -> None:
        log = self.log
        if log is not None and not done:
            log.statements.append(sql)


def statement_kind(sql: str) -> str:
    """The leading keyword(s): INSERT, SELECT, UPDATE, BEGIN IMMEDIATE, SAVEPOINT, RELEASE SAVEPOINT, ..."""
    words = sql.split()
    if not words:
        return ""
    first = words[0].upper()
    second = words[1].upper() if len(words) > 1 else ""
    if first in ("BEGIN", "RELEASE") and second in ("IMMEDIATE", "EXCLUSIVE", "DEFERRED", "SAVEPOINT", "TRANSACTION"):
        return f"{first} {second}"
    if first == "ROLLBACK" and second == "TO":
        return "ROLLBACK TO SAVEPOINT"
    if first == "WITH":
        return "WITH"
    return first


@contextmanager
def record_statements(engine: Engine, recorder: Recorder | None = None) -> Iterator[StatementLog]:
    """Log every statement and commit on `engine` while the block runs, with the store's own statements from
    `recorder` (the `statement_hook` the store was built with). Engine-wide: under concurrent requests it gives the
    totals of all of them."""
    log = StatementLog()
    if recorder is not None:
        recorder.log = log

    def on_execute(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        log.statements.append(statement)

    def on_commit(conn: Any) -> None:
        log.commits += 1

    hooks: list[tuple[str, Callable[..., None]]] = [("before_cursor_execute", on_execute), ("commit", on_commit)]
    for name, fn in hooks:
        event.listen(engine, name, fn)
    try:
        yield log
    finally:
        if recorder is not None:
            recorder.log = None
        for name, fn in hooks:
            event.remove(engine, name, fn)
