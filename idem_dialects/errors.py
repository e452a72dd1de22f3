"""One error vocabulary: the IdemError hierarchy, the retry causes, and the library's warning category.

Every error carries its data as attributes, not only in its message; an error that maps to an HTTP answer carries
`http_status`. No message ever includes a stored response, request body or claim token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import ClassVar


class RetryCause(StrEnum):
    """Why `run` may retry: what a backend's `retry_cause` returns and `RetriesExhausted.causes` tallies."""

    BUSY = "busy"  # a one-writer engine's lock (SQLite), Oracle's resource busy
    SERIALIZATION = "serialization failure"  # the snapshot cannot see (or conflicts with) a committed winner
    DEADLOCK = "deadlock"  # this transaction was the deadlock victim
    LOCK_TIMEOUT = "lock timeout"  # a lock wait outlasted the engine's lock timeout
    CONNECTION = "lost connection"  # the connection dropped; the transaction did not commit
    CLAIM_RACE = "claim race"  # the record kept changing between our insert and our read
    CONNECT = "connect"  # a connection could not be opened (refused, server starting, read-only standby, ...)
    CANCELLED = "cancelled"  # the server cancelled one of the protocol's own statements (statement timeout)
    CERTIFICATION = "certification failure"  # a multi-primary cluster (Galera) let another node's commit win
    NODE_NOT_READY = "node not ready"  # a cluster node is joining or outside the primary component (Galera 1047)
    POOL = "pool exhausted"  # every connection of SQLAlchemy's pool stayed in use for its pool_timeout
    ROTATION = "generation rotation"  # the records table was renamed a moment ago (a generation rotated, MySQL)


class IdemWarning(UserWarning):
    """Warnings of idem-dialects (e.g. a configuration that works but is probably not what was meant)."""


class IdemError(Exception):
    """Base class of every error this library raises on purpose."""

    # The HTTP status this error maps to, for services that answer HTTP requests; None where it maps to none.
    http_status: ClassVar[int | None] = None


class InvalidKey(IdemError, ValueError):
    """A scope, operation, key (or subscriber / message id) breaks a rule; raised before any SQL (HTTP 400)."""

    http_status = 400

    def __init__(self, field: str, rule: str, value: object) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        super().__init__(f"{field} {rule} (got {shown})")


class InvalidPayload(IdemError, TypeError):
    """A request, payload, response or status that cannot be stored and replayed exactly; raised before any SQL."""

    http_status = 400

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class KeyedError(IdemError):
    """An answer about one idempotency record: `scope`, `operation` and `key` say which."""

    def __init__(self, scope: str, operation: str, key: str, message: str) -> None:
        self.scope = scope
        self.operation = operation
        self.key = key
        super().__init__(f"key {key!r} in {scope!r}/{operation!r} {message}")


class RequestMismatch(KeyedError):
    """The key was first used with a different request (HTTP 422); the effect did not run."""

    http_status = 422

    def __init__(self, scope: str, operation: str, key: str, stored: str | None, given: str | None) -> None:
        self.stored_fingerprint = stored
        self.given_fingerprint = given
        super().__init__(scope, operation, key, f"was first used with a different request (stored fingerprint"
                                                f" {stored}, this request {given})")


class RequestInFlight(KeyedError):
    """Another attempt holds a live lease on the key (HTTP 409 with Retry-After)."""

    http_status = 409

    def __init__(self, scope: str, operation: str, key: str, retry_after: float) -> None:
        self.retry_after = retry_after
        super().__init__(scope, operation, key, f"is in flight; retry after {retry_after:.3f}s")


class LeaseLost(KeyedError):
    """The claim was taken over (its lease expired) or completed by someone else; roll the transaction back.

    The claim token is kept as `token` for the caller, never put in the message (it fences the record)."""

    http_status = 409

    def __init__(self, scope: str, operation: str, key: str, token: str) -> None:
        self.token = token
        super().__init__(scope, operation, key, "is no longer held by this claim (taken over or completed)")


class TransientError(IdemError):
    """A condition of the library's own that clears up when the transaction runs again; `run` retries it.

    Raised out of `claim()` when called directly: retry the caller's transaction (or use `run`)."""

    http_status = 503
    cause: ClassVar[RetryCause]


class ClaimRaced(TransientError):
    """The record changed between our insert and our read too many times in a row (purged, taken over, rolled
    back); contention to back off from, not a loop to spin in."""

    cause = RetryCause.CLAIM_RACE


class WinnerNotVisible(TransientError):
    """The claim hit a committed record this transaction's snapshot cannot see (SQL Server SNAPSHOT, Oracle
    SERIALIZABLE: both read as of the transaction's start). A new transaction's snapshot includes it."""

    cause = RetryCause.SERIALIZATION

    def __init__(self, table: str) -> None:
        self.table = table
        super().__init__(f"{table}: an existing record committed after this transaction's snapshot began;"
                         " retry in a new transaction")


class CannotConnect(TransientError):
    """A connection to the database could not be opened (refused, reset, server starting or shutting down, a
    read-only standby). No statement ran, so `run` retries it within its budget; the driver's error is the
    __cause__. `reason` says what happened in plain words where the backend knows (a socket error under the
    driver's); else the message is the driver's own first line."""

    cause = RetryCause.CONNECT

    def __init__(self, backend: str, error: BaseException, reason: str | None = None) -> None:
        self.backend = backend
        super().__init__(f"cannot connect to the {backend} database: {reason or _first_line(error)}")


class PoolExhausted(TransientError):
    """Every connection of the engine's pool stayed in use for its whole `pool_timeout` (SQLAlchemy's TimeoutError
    is the __cause__). Contention, not a fault: `run` retries it within its budget (another caller giving a
    connection back ends it), then raises RetriesExhausted with this as its last error. The pool's numbers are
    attributes (None where the pool does not have them); the fix is a bigger pool, fewer concurrent callers, or a
    longer `pool_timeout`."""

    cause = RetryCause.POOL

    def __init__(self, backend: str, pool_size: int | None, max_overflow: int | None, timeout: float | None,
                 checked_out: int | None) -> None:
        self.backend = backend
        self.pool_size = pool_size
        self.max_overflow = max_overflow
        self.timeout = timeout
        self.checked_out = checked_out
        waited = f" within pool_timeout={timeout:g}s" if timeout is not None else ""
        in_use = f"{checked_out} connections in use, " if checked_out is not None else ""
        super().__init__(
            f"no connection to the {backend} database free in the engine's pool{waited} ({in_use}pool_size="
            f"{pool_size}, max_overflow={max_overflow}); give the engine a bigger pool (create_engine's pool_size,"
            " max_overflow), call the store from fewer concurrent callers (an effect that opens a second"
            " connection from the same pool needs two per call), or a longer pool_timeout")


class ResponseTooLarge(IdemError):
    """The response to store is larger than the database takes in one statement (MySQL/MariaDB's
    max_allowed_packet, PostgreSQL's 1 GiB per message and value), as the driver would send it. Refused before the
    completion is sent and never retried, so the effect is not run again: its transaction rolls back (an atomic
    effect's database writes with it) and a leased claim is released. `size` is the response's bytes as the driver
    sends them (escaped or hex-encoded by some), `limit` the most the server takes for it (its statement limit less
    the rest of the statement), `setting` what sets the statement limit."""

    http_status = 500

    def __init__(self, backend: str, size: int, limit: int, setting: str) -> None:
        self.backend = backend
        self.size = size
        self.limit = limit
        self.setting = setting
        super().__init__(
            f"the response is too large to store: {size:,} bytes as the driver sends it, and the {backend} database"
            f" takes at most {limit:,} ({setting}, less the rest of the statement); nothing was stored, and run does"
            " not retry it. Store a smaller response (e.g. where the data can be fetched), or raise the limit where the"
            " server has a setting for it")


class RetriesExhausted(IdemError):
    """`run` kept hitting retryable errors until its budget ran out; the last error is the __cause__ (HTTP 503).

    `causes` tallies every failed attempt by cause; `retried` only the failures that were followed by a retry.
    `shard`: the shard of a sharded store the attempts ran on (None on a store of one database)."""

    http_status = 503

    def __init__(self, attempts: int, elapsed: float, causes: Mapping[str, int], last: BaseException,
                 retried: Mapping[str, int] | None = None, shard: str | None = None) -> None:
        self.attempts = attempts
        self.elapsed = elapsed
        self.causes = dict(causes)
        self.retried = {c: n for c, n in (retried or {}).items() if n}
        self.last_error = last
        self.shard = shard
        tally = ", ".join(f"{cause} x{count}" for cause, count in sorted(self.causes.items()))
        redone = ", ".join(f"{cause} x{count}" for cause, count in sorted(self.retried.items()))
        plural = "attempt" if attempts == 1 else "attempts"
        where = "" if shard is None else f"shard {shard!r}: "
        super().__init__(
            f"{where}gave up after {attempts} {plural} in {elapsed:.2f}s; failed attempts by cause: {tally}"
            + (f"; retried: {redone}" if redone else "")
            + f"; last error: {type(last).__name__}: {_first_line(last)}"
        )

    def on_shard(self, shard: str) -> RetriesExhausted:
        """The same failure, naming the shard it happened on (its last error stays the __cause__)."""
        if self.shard is not None:
            return self
        named = RetriesExhausted(self.attempts, self.elapsed, self.causes, self.last_error, self.retried, shard)
        named.__cause__ = self.__cause__
        for note in getattr(self, "__notes__", ()):
            named.add_note(note)
        return named


class ConfigurationError(IdemError):
    """The store cannot work as configured; the message says how to fix it."""


class ConnectionConfigError(ConfigurationError):
    """Connecting failed in a way no retry can fix (driver missing, bad credentials, unknown database); the
    message says what to change. The driver's error is the __cause__."""

    def __init__(self, backend: str, problem: str, fix: str) -> None:
        self.backend = backend
        self.problem = problem
        self.fix = fix
        super().__init__(f"cannot connect to the {backend} database: {problem}; {fix}")


class UnsupportedEngine(ConfigurationError):
    """No backend is registered for the URL's dialect name."""

    def __init__(self, name: str, known: Sequence[str], hint: str = "") -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(f"no idem-dialects backend for {name!r}; known backends: {', '.join(self.known)}"
                         + (f"; {hint}" if hint else ""))


class MissingTables(ConfigurationError):
    """The store's tables do not exist in this database (HTTP 503: the service cannot take idempotent requests
    until they are created; nothing is wrong with the request)."""

    http_status = 503

    def __init__(self, tables: tuple[str, ...]) -> None:
        self.tables = tables
        super().__init__(f"the idempotency tables {', '.join(tables)} do not exist in this database: call"
                         " store.create_tables() or run `idem-dialects init URL`")


class InsufficientPrivilege(ConfigurationError):
    """The database role may not create (or use) the store's tables."""

    def __init__(self, tables: tuple[str, ...], creating: bool) -> None:
        self.tables = tables
        self.creating = creating
        if creating:
            fix = ("this database role may not create tables: ask for the CREATE privilege, or have a DBA apply"
                   " the statements `idem-dialects ddl URL` prints")
        else:
            fix = (f"this database role may not use {', '.join(tables)}: grant it SELECT, INSERT, UPDATE and DELETE"
                   " on them")
        super().__init__(fix)


class InvalidURL(ConfigurationError):
    """The text given as a database URL is not one (never repeated in the message: it may hold a password).
    `expected` says what to write instead (default: the URL's general form)."""

    def __init__(self, problem: str = "not a database URL", expected: str | None = None) -> None:
        self.problem = problem
        self.expected = expected or ("write it as DIALECT[+DRIVER]://USER[:PASSWORD]@HOST[:PORT]/DB, e.g."
                                     " postgresql+psycopg://app@db/app or sqlite:///path/to.db")
        super().__init__(f"{problem}; {self.expected}")


class InvalidURLOption(ConfigurationError):
    """A query option of the URL that idem-dialects consumes (failover_window, pooler, writers) is wrong."""

    def __init__(self, option: str, problem: str) -> None:
        self.option = option
        self.problem = problem
        super().__init__(f"URL option {option}: {problem}; see the documentation: Clusters and failover, URL options")


class MissingDriver(ConfigurationError):
    """The URL names a driver that is not installed (or cannot load); the message says what to install."""

    def __init__(self, drivername: str, hint: str, cause: BaseException, library: str | None = None) -> None:
        self.drivername = drivername
        self.library = library  # the system library the installed driver cannot load, if that is the cause
        self.problem = (f"the driver for {drivername} URLs is installed but cannot load the system library {library}"
                        if library else f"the driver for {drivername} URLs cannot be loaded ({_first_line(cause)})")
        self.fix = hint
        super().__init__(f"{self.problem}: {hint}")


class AsyncMisuse(ConfigurationError, TypeError):
    """Sync and async were mixed: an async URL, engine or `async def` effect given to the sync store, or a sync one
    to the async store. Raised before any SQL; the message names the class or form to use instead."""


class UnsupportedIsolation(ConfigurationError):
    """The engine is configured with an isolation level the backend does not guarantee the protocol under."""

    def __init__(self, backend: str, level: str, supported: Sequence[str], setting: str | None = None) -> None:
        self.backend = backend
        self.level = level
        self.supported = tuple(supported)
        self.setting = setting  # the driver's own setting that put the connection in autocommit mode, if that was it
        why = (" (AUTOCOMMIT commits every statement alone, so a failing effect would leave its claim behind)"
               if level == "AUTOCOMMIT" else "")
        if setting is not None:
            super().__init__(f"the {backend} backend cannot run on a driver connection in autocommit mode ({setting}):"
                             " every statement would commit alone, so a failing effect would leave its claim behind;"
                             " remove that setting (the store begins and commits its own transactions)")
            return
        super().__init__(f"the {backend} backend does not support isolation_level={level!r}{why}; use one of"
                         f" {', '.join(self.supported)}, or leave isolation_level unset for the engine's default")


def _first_line(exc: BaseException) -> str:
    # SQLAlchemy appends the statement and its parameters on later lines: never repeat those (stored values). Its
    # wrapper's text also starts with the driver's class, "(psycopg.OperationalError) ...": the driver's own words
    # are those of `orig`.
    orig = getattr(exc, "orig", None)
    text = str(orig if isinstance(orig, BaseException) else exc).strip()
    return text.splitlines()[0] if text else "(no message)"
