"""What the store does to errors of its own statements, on any engine it is given (a ``handle_error`` listener).

- **No stored values in error text.** SQLAlchemy appends ``[parameters: ...]`` (responses, claim tokens, request
  fingerprints) to a statement's error unless the engine has ``hide_parameters=True``; `from_url` sets it
  (`url.Target.engine_options`), and for an engine the caller built the listener hides the parameters of the
  store's own statements. The backend also redacts driver text that repeats a row (PostgreSQL's "Failing row
  contains (...)").
- **Configuration mistakes say how to fix them.** A missing table or a missing privilege, recognised by the
  backend by driver error code, becomes a `ConfigurationError` naming the fix (chained from the driver's error).

Only the store's statements (those naming its tables) are touched: an effect's own errors reach the caller unchanged.
"""

from __future__ import annotations

import functools
import re
import weakref
from typing import TYPE_CHECKING

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError

from .errors import InsufficientPrivilege, MissingTables

if TYPE_CHECKING:
    from .dialects.base import Backend

MISSING_TABLE = "missing table"
NO_PRIVILEGE = "insufficient privilege"


# engine -> {table name: backend}; weak, so a disposed engine and its stores go away.
_guarded: weakref.WeakKeyDictionary[Engine, dict[str, Backend]] = weakref.WeakKeyDictionary()


def guard(engine: Engine, backend: Backend, tables: tuple[str, ...]) -> None:
    """Install the listener on `engine` once, and make it cover `tables`."""
    known = _guarded.get(engine)
    if known is None:
        known = _guarded[engine] = {}
        event.listen(engine, "handle_error", _handle_error)
    for name in tables:
        known[name] = backend


@functools.lru_cache(maxsize=64)
def _names_pattern(names: frozenset[str]) -> re.Pattern[str]:
    """One search for every table name of a store, as a whole identifier: compiled once per set of tables, since
    every replay on MySQL/MariaDB (a duplicate-key error) comes through here."""
    return re.compile(r"(?<![\w$])(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")(?![\w$])")


def _ours(statement: str | None, known: dict[str, Backend]) -> list[str]:
    if not statement:
        return []
    found = dict.fromkeys(_names_pattern(frozenset(known)).findall(statement))
    return [name for name in known if name in found]


def _handle_error(context: ExceptionContext) -> BaseException | None:
    # An earlier listener (a backend's) may have replaced the error: act on the one that will be raised.
    chained = getattr(context, "chained_exception", None)  # set by SQLAlchemy only once a listener replaced it
    exc = chained if isinstance(chained, DBAPIError) else context.sqlalchemy_exception
    known = _guarded.get(context.engine) if context.engine is not None else None
    if not isinstance(exc, DBAPIError) or not known:
        return None
    names = _ours(context.statement, known)
    if not names:
        return None
    backend = known[names[0]]
    exc.hide_parameters = True
    backend.redact(exc)
    # Only statements the store compiled: dialects probe for tables with driver SQL (MySQL's DESCRIBE) and expect
    # the driver's own error back.
    compiled = context.execution_context is not None and context.execution_context.compiled is not None
    problem = backend.config_problem(exc, context, names) if compiled else None
    if problem == MISSING_TABLE:
        return MissingTables(tuple(names))
    if problem == NO_PRIVILEGE:
        creating = (context.statement or "").lstrip().upper().startswith("CREATE")
        return InsufficientPrivilege(tuple(names), creating)
    return None
