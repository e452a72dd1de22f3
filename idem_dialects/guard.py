"""What the store does to errors of its own statements, on any engine it is given (a ``handle_error`` listener).

- **No stored values in error text.** SQLAlchemy appends ``[parameters: ...]`` (responses, claim tokens, request
  fingerprints) to a statement's error unless the engine has ``hide_parameters=True``; `from_url` sets it, and for
  an engine the caller built the listener hides the parameters of the store's own statements. The backend also
  redacts driver text that repeats a row (PostgreSQL's "Failing row contains (...)").
- **Configuration mistakes say how to fix them.** A missing table or a missing privilege, recognised by the
  backend by driver error code, becomes a `ConfigurationError` naming the fix (chained from the driver's error).

Only the store's statements (those naming its tables) are touched: an effect's own errors reach the caller unchanged.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.engine import URL, ExceptionContext
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from . import dialects
from .errors import ConfigurationError, InsufficientPrivilege, InvalidURL, MissingDriver, MissingTables

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


def _ours(statement: str | None, known: dict[str, Backend]) -> list[str]:
    if not statement:
        return []
    return [name for name in known if re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", statement)]


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


def parse_url(url: str | URL) -> URL:
    """`make_url`, with a ConfigurationError (never repeating the text: it may hold a password) for a non-URL."""
    try:
        return make_url(url)
    except ArgumentError:
        raise InvalidURL() from None


def engine_options(backend: type[Backend], url: URL, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of an engine `from_url` builds (sync or async): ``hide_parameters`` unless the caller says
    otherwise, so no stored response, token or request value reaches an error message or a log line (SQLAlchemy's
    ``echo`` included), then what the backend needs."""
    return backend.engine_options(url, {"hide_parameters": True, **options})


def build_engine(url: URL, options: dict[str, Any]) -> Engine:
    """`create_engine`, with a ConfigurationError that says what to install when the URL's driver cannot load."""
    backend, _, driver = url.drivername.partition("+")
    try:
        return create_engine(url, **options)
    except NoSuchModuleError:
        raise ConfigurationError(f"SQLAlchemy has no driver {driver!r} for {backend}:// URLs; leave it out"
                                 f" ({backend}://) for the default, or see the supported drivers in README") from None
    except ImportError as exc:
        hint = dialects.install_hint(backend, driver or url.get_dialect().driver)
        raise MissingDriver(url.drivername, hint, exc) from exc


def resolve_url(url: str | URL) -> URL:
    """The URL as `IdempotencyStore.from_url` builds its engine from it (a bare ``mysql://`` gets the installed
    driver), checking that a backend exists for it and that its driver loads; no connection is made."""
    parsed = parse_url(url)
    parsed = dialects.load(parsed.get_backend_name()).resolve_url(parsed)
    build_engine(parsed, {}).dispose()  # MissingDriver now, not a connection error later
    return parsed
