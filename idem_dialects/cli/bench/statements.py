"""Counting what a request sends: statements through cursors and driver-level commits, per engine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event

from ... import dialects


@dataclass
class StatementLog:
    """SQL the engine sent through cursors (BEGIN IMMEDIATE and SAVEPOINTs included), driver-level commits and
    rollbacks, and the pool's resets of a connection given back (a rollback the driver may send to the server)."""

    statements: list[str] = field(default_factory=list)
    commits: int = 0
    rollbacks: int = 0
    resets: int = 0

    @property
    def kinds(self) -> list[str]:
        return [statement_kind(s) for s in self.statements]


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
def record_statements(engine: Engine) -> Iterator[StatementLog]:
    """Log every statement and commit on `engine` while the block runs. Engine-wide: under concurrent requests it
    gives the totals of all of them."""
    log = StatementLog()

    def on_execute(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        log.statements.append(statement)

    def on_commit(conn: Any) -> None:
        log.commits += 1

    def on_rollback(conn: Any) -> None:
        log.rollbacks += 1

    def on_reset(*args: Any) -> None:
        log.resets += 1

    hooks: list[tuple[str, Callable[..., None]]] = [
        ("before_cursor_execute", on_execute), ("commit", on_commit), ("rollback", on_rollback), ("reset", on_reset)]
    for name, fn in hooks:
        event.listen(engine, name, fn)
    try:
        yield log
    finally:
        for name, fn in hooks:
            event.remove(engine, name, fn)


def reset_reaches_server(engine: Engine) -> bool:
    """Whether the pool's reset of a connection returned after a request is a round trip (the backend knows: e.g.
    MySQL/MariaDB drivers send ROLLBACK unless from_url's engine leaves the reset to the backend's hook; counted on
    the server by tests/test_statement_counts.py). psycopg skips it when idle, and SQLite's is in-process."""
    return dialects.load(engine.url.get_backend_name()).pool_reset_round_trip(engine.pool)


def implicit_begin(engine: Engine) -> str | None:
    """The BEGIN a driver sends on its own (not through a cursor SQLAlchemy sees), if it sends one."""
    return dialects.load(engine.url.get_backend_name()).implicit_begin(engine.dialect.driver)
