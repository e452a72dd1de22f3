"""What the store does to errors of its own statements, on any engine it is given.

- **No stored values in error text.** SQLAlchemy appends ``[parameters: ...]`` (responses, claim tokens, request
  fingerprints) to a statement's error unless the engine has ``hide_parameters=True``; `from_url` sets it
  (`url.Target.engine_options`), and for an engine the caller built the store hides the parameters of its own
  statements. The backend also redacts driver text that repeats a row (PostgreSQL's "Failing row contains (...)").
- **Configuration mistakes say how to fix them.** A missing table or a missing privilege, recognised by the
  backend by driver error code, becomes a `ConfigurationError` naming the fix (chained from the driver's error).

Statements the store runs natively go through `store_error`; those it runs through SQLAlchemy (`cursor_events`, or a
driver without a native form) through a ``handle_error`` listener that finds the store's tables in the statement.
Only the store's statements are touched: an effect's own errors reach the caller unchanged.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError

from .dialects.classify import MISSING_TABLE, NO_PRIVILEGE
from .errors import InsufficientPrivilege, MissingTables

if TYPE_CHECKING:
    from .dialects.base import Backend


def store_error(backend: Backend, exc: DBAPIError, tables: Sequence[str], dbapi_connection: Any,
                creating: bool = False) -> BaseException:
    """What a store statement's error on `tables` is raised as: a ConfigurationError naming the fix, or `exc` itself,
    its parameters hidden and its driver text redacted."""
    exc.hide_parameters = True
    backend.errors.redact(exc)
    problem = backend.errors.config_problem(exc, tables, dbapi_connection) if tables else None
    if problem == MISSING_TABLE:
        return MissingTables(tuple(tables))
    if problem == NO_PRIVILEGE:
        return InsufficientPrivilege(tuple(tables), creating)
    return exc


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
    """One search for every table name of a store, as a whole identifier: compiled once per set of tables."""
    return re.compile(r"(?<![\w$])(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")(?![\w$])")


def _ours(statement: str | None, known: dict[str, Backend]) -> list[str]:
    if not statement:
        return []
    found = dict.fromkeys(_names_pattern(frozenset(known)).findall(statement))
    return [name for name in known if name in found]


def _handle_error(context: ExceptionContext) -> BaseException | None:
    # An earlier listener (a driver's) may have replaced the error: act on the one that will be raised.
    chained = getattr(context, "chained_exception", None)  # set by SQLAlchemy only once a listener replaced it
    exc = chained if isinstance(chained, DBAPIError) else context.sqlalchemy_exception
    known = _guarded.get(context.engine) if context.engine is not None else None
    if not isinstance(exc, DBAPIError) or not known:
        return None
    names = _ours(context.statement, known)
    if not names:
        return None
    # Only statements the store compiled: dialects probe for tables with driver SQL (MySQL's DESCRIBE) and expect
    # the driver's own error back; a native statement's error is classified by its executor (`store_error`).
    compiled = context.execution_context is not None and context.execution_context.compiled is not None
    dbapi = context.connection.connection.dbapi_connection if compiled and context.connection is not None else None
    creating = (context.statement or "").lstrip().upper().startswith("CREATE")
    found = store_error(known[names[0]], exc, names if compiled else (), dbapi, creating)
    return None if found is exc else found
