"""Counting what a request sends: statements through cursors and driver-level commits, per engine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event

from ...dialects.mysql import resets_by_hook


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
    """Whether the pool's reset of a connection returned after a request is a round trip: MySQL/MariaDB drivers send
    ROLLBACK even with no transaction open, unless the engine's pool leaves the reset to MySQLBackend's hook (from_url's
    engines), which skips it after the store's own COMMIT, as every request here ends (counted on the server by
    tests/test_statement_counts.py). psycopg skips it when idle, and SQLite's is in-process."""
    return engine.dialect.name in ("mysql", "mariadb") and not resets_by_hook(engine.pool)


def implicit_begin(engine: Engine) -> str | None:
    """The BEGIN a driver sends on its own (not through a cursor SQLAlchemy sees), if it sends one."""
    if engine.dialect.driver in ("psycopg", "psycopg2"):
        return "psycopg sends BEGIN before a transaction's first statement (one more round trip)"
    if engine.dialect.driver == "asyncpg":  # SQLAlchemy's adapter starts an asyncpg Transaction: BEGIN on the wire
        return "asyncpg sends BEGIN when a transaction starts (one more round trip)"
    return None
