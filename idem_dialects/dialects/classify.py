"""How one engine's driver errors are read: the error classifier every backend names (`Backend.classifier`).

Classified by driver error code (SQLSTATE, a server error number), never by message text. One subclass per engine;
`is_duplicate` is required, the rest have portable defaults.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import Pool

from ..drivers import Driver
from ..errors import CannotConnect, IdemError, PoolExhausted, RetryCause, TransientError
from ..features import Features
from . import options
from .network import socket_problem


class Classified(Protocol):
    """What a classifier reads of its backend (`base.Backend`)."""

    @property
    def name(self) -> str: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def features(self) -> Features: ...

    @property
    def drivers(self) -> tuple[Driver, ...]: ...

# What `config_problem` finds: the store's table is not there, or the role may not use (or create) it.
MISSING_TABLE = "missing table"
NO_PRIVILEGE = "insufficient privilege"
# How a URL writes the characters that end a password early or change it (RFC 3986 percent-encoding).
PERCENT_ENCODING = "@ as %40, : as %3A, / as %2F, # as %23, % as %25, ? as %3F"


def credentials_fix(fix: str, url: URL) -> str:
    """`fix` for a refused user or password, and, when the URL has a password, how the URL writes one: a "%" followed
    by two hex digits is read as an encoded character, so a password holding one unencoded is refused."""
    return fix if url.password is None else f"{fix}; a URL holds a password percent-encoded ({PERCENT_ENCODING})"


class ErrorClassifier(ABC):
    """The errors of one backend's statements and connections, for `backend` (whose features and URL some
    classifications depend on: a Galera node's certification failures, the user a wrong password belongs to)."""

    def __init__(self, backend: Classified) -> None:
        self.backend = backend

    @abstractmethod
    def is_duplicate(self, exc: DBAPIError) -> bool:
        """Required. True only for a primary-key / unique violation (never NOT NULL, CHECK or a foreign key)."""

    def is_already_created(self, exc: DBAPIError) -> bool:
        """True if a CREATE failed because another session created the same table or index first (so
        `create_tables`, re-run, finds it). The default: nothing is (an engine that serializes DDL never races)."""
        return False

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        """True if a statement under `Backend.not_waiting` failed because it would have waited for another's lock."""
        return False

    def lost_session_state(self, exc: DBAPIError) -> bool:
        """True if a statement failed because the server session lacks what the driver left on it in an earlier
        transaction (a prepared statement it made, or one that is already there under the driver's name): a
        transaction-mode pooler (PgBouncer) ran that transaction on another server session. The store then reopens
        the engine's connections without prepared statements and `run` retries (`Features.session_state` False)."""
        return False

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        """Why `run` may retry after `exc`, or None if it must not. Engines classify their driver's codes and defer
        to this for the library's own transient errors, connections SQLAlchemy saw drop, and a socket an async driver
        lost mid-statement (asyncpg and aiosqlite's thread raise OSError/ConnectionError unwrapped)."""
        if isinstance(exc, TransientError):
            return exc.cause
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            return RetryCause.CONNECTION
        if isinstance(exc, ConnectionError):
            return RetryCause.CONNECTION
        return None

    def connect_error(self, exc: BaseException) -> IdemError | None:
        """What a failure to open a connection means: CannotConnect (transient: refused, reset, too many
        connections, the server starting or stopping), ConnectionConfigError (no retry can fix it: wrong password,
        unknown user, database or host), or None (the error propagates as it is). `exc` is whatever opening the
        connection raised: a DBAPIError, or a driver's own exception SQLAlchemy did not wrap. The portable default:
        a socket-level cause (below the driver), then an OperationalError nothing else classifies, is transient."""
        problem = socket_problem(self.backend.name, exc)
        if problem is not None:
            return problem
        # A driver refusing its connect() arguments (a TypeError or ValueError of its own, or the DB-API's
        # ProgrammingError) does so for the URL's options before any server answers: the same on every retry.
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(orig, (TypeError, ValueError)) or isinstance(exc, ProgrammingError):
            refused = options.refused(self.backend.name, self.backend.engine.url, exc)
            if refused is not None:
                return refused
        if isinstance(exc, OperationalError) or self.retry_cause(exc) is not None:
            return CannotConnect(self.backend.name, exc)
        return None

    def checkout_error(self, exc: BaseException) -> IdemError | None:
        """What the store raises when getting a connection from the engine failed with `exc`: PoolExhausted (with
        the pool's numbers) when every connection of the pool stayed in use for its pool_timeout, else what opening
        a new one failed with (`connect_error`). Engines classify `connect_error`; this one is the same everywhere."""
        if isinstance(exc, PoolTimeout):
            return pool_exhausted(self.backend.name, self.backend.engine.pool)
        return self.connect_error(exc)

    def config_problem(self, exc: DBAPIError, tables: Sequence[str], dbapi_connection: Any) -> str | None:
        """MISSING_TABLE or NO_PRIVILEGE if a store statement on `tables` failed because a table
        does not exist or the role lacks a privilege (by driver error code), else None. `dbapi_connection` is the
        connection it failed on, for an engine that must ask (SQLite's generic error code)."""
        return None

    def redact(self, exc: DBAPIError) -> None:
        """Remove from a failed store statement's driver error any text that repeats stored values (a row's
        contents); the statement's parameters are already hidden. Most drivers never repeat values: no-op."""
        return None


def pool_exhausted(backend: str, pool: Pool) -> PoolExhausted:
    """PoolExhausted with what a QueuePool (and its asyncio form) knows of itself: its size, timeout and checked-out
    count are public methods, its max_overflow a private attribute only (tests/test_pool_exhausted.py fails if it
    moves); None for what another kind of pool lacks."""
    def number(name: str) -> Any:
        value = getattr(pool, name, None)
        return value() if callable(value) else value

    overflow = getattr(pool, "_max_overflow", None)
    return PoolExhausted(backend, number("size"), overflow if isinstance(overflow, int) else None,
                         number("timeout"), number("checkedout"))
