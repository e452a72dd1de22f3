"""PostgreSQL's errors, by SQLSTATE (Appendix A of the PostgreSQL manual); classification never looks at message
text. psycopg 3 names it ``sqlstate``, psycopg2 ``pgcode``, pg8000 the ``C`` field of its error dict, and SQLAlchemy's
asyncpg adapter keeps asyncpg's ``sqlstate``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from ..errors import CannotConnect, ConnectionConfigError, IdemError, RetryCause
from . import options
from .classify import MISSING_TABLE, NO_PRIVILEGE, ErrorClassifier, credentials_fix
from .network import socket_problem
from .postgresql_startup import ACCEPTED, PASSWORD_REQUIRED, startup_sqlstate

UNIQUE_VIOLATION = "23505"
UNDEFINED_TABLE = "42P01"
INSUFFICIENT_PRIVILEGE = "42501"
LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout expired (or NOWAIT)
# A driver's prepared statement missing on this server session (invalid_sql_statement_name: psycopg's "_pg3_N",
# asyncpg's "__asyncpg_stmt_N__"), or there already (duplicate_prepared_statement): behind a transaction-mode pooler.
_SESSION_STATE_LOST = frozenset({"26000", "42P05"})
# A concurrent CREATE TABLE of one name: 42P07 if the other committed first, else a unique violation in the catalog
# (pg_type's row for the table's composite type) once it does; 42710 for a constraint or index name.
_ALREADY_CREATED = frozenset({"42P07", "42710", UNIQUE_VIOLATION})
# The DETAIL PostgreSQL adds to NOT NULL / CHECK / partition violations repeats the whole row (responses, tokens).
_FAILING_ROW = re.compile(r"\n?DETAIL:\s+Failing row contains .*", re.S)
_RETRYABLE = {
    "40001": RetryCause.SERIALIZATION,  # serialization_failure (RR/SERIALIZABLE snapshot conflicts, SSI)
    "40P01": RetryCause.DEADLOCK,  # deadlock_detected: this transaction was chosen as the victim and rolled back
    LOCK_NOT_AVAILABLE: RetryCause.LOCK_TIMEOUT,  # lock_not_available: lock_timeout expired or NOWAIT
    "57P01": RetryCause.CONNECTION,  # admin_shutdown: pg_terminate_backend, fast shutdown
    "57P02": RetryCause.CONNECTION,  # crash_shutdown
    "57P03": RetryCause.CONNECTION,  # cannot_connect_now: server starting up or in recovery
    "57014": RetryCause.CANCELLED,  # query_canceled: statement_timeout (never retried for the effect's statements)
    # read_only_sql_transaction: the server reached is a read-only standby (after a failover); nothing was written,
    # and a new connection (target_session_attrs=read-write) finds the new primary.
    "25006": RetryCause.CONNECT,
}
# Opening a connection: what only a changed configuration fixes (by SQLSTATE, or its class), and the classes a
# retry may outlast (08 connection exception, 53 insufficient resources: too many clients, 57 operator intervention:
# starting up, shutting down).
_CONNECT_CONFIG = {
    "28": ("authentication failed for user {user!r}",
           "check the user and password in the URL (and the server's pg_hba.conf)"),
    "3D000": ("the database {database!r} does not exist", "check the URL's database name or create it"),
    "42501": ("user {user!r} may not connect to database {database!r}",
              "GRANT CONNECT ON DATABASE to it, or use another user"),
}
_CONNECT_TRANSIENT_CLASSES = frozenset({"08", "53", "57"})
_LIBPQ_DRIVERS = frozenset({"psycopg", "psycopg2"})  # drivers whose connect errors come from libpq (no SQLSTATE)
_CONNECTION_CLASS = "08"  # connection_exception and its subclasses
# libpq's target_session_attrs values that ask for a kind of server: refused by one of the other kind (a failover
# under way, a standby not yet promoted), which a new connection may find.
_SESSION_KINDS = frozenset({"read-write", "read-only", "primary", "standby", "prefer-standby"})


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, wrapped by SQLAlchemy or not: psycopg 3 ``sqlstate``, psycopg2 ``pgcode``,
    pg8000 the ``C`` field of its error dict. None when the error did not come from the server."""
    orig: Any = exc.orig if isinstance(exc, DBAPIError) else exc
    for attr in ("sqlstate", "pgcode"):
        code = getattr(orig, attr, None)
        if isinstance(code, str) and code:
            return code
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], dict):
        code = args[0].get("C")
        if isinstance(code, str) and code:
            return code
    return None


def _connects_now(engine: Engine) -> bool:
    """Whether one new connection, made exactly as `engine` makes its own (its creator and connect events, in a
    throwaway pool: the engine's own may hand back an idle one), opens now."""
    pool = engine.pool.recreate()
    try:
        pool.connect().close()
    except Exception:
        return False
    finally:
        pool.dispose()
    return True


class PostgreSQLErrors(ErrorClassifier):
    def is_duplicate(self, exc: DBAPIError) -> bool:
        return sqlstate(exc) == UNIQUE_VIOLATION

    def is_already_created(self, exc: DBAPIError) -> bool:
        return sqlstate(exc) in _ALREADY_CREATED

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        return sqlstate(exc) == LOCK_NOT_AVAILABLE

    def lost_session_state(self, exc: DBAPIError) -> bool:
        return sqlstate(exc) in _SESSION_STATE_LOST

    def config_problem(self, exc: DBAPIError, tables: Sequence[str], dbapi_connection: Any) -> str | None:
        return {UNDEFINED_TABLE: MISSING_TABLE, INSUFFICIENT_PRIVILEGE: NO_PRIVILEGE}.get(sqlstate(exc) or "")

    def redact(self, exc: DBAPIError) -> None:
        # psycopg and psycopg2 put DETAIL in their message; pg8000 keeps it under "D" in its error dict.
        orig: Any = exc.orig
        for error in (orig, exc):
            args = getattr(error, "args", ())
            if args and isinstance(args[0], str) and _FAILING_ROW.search(args[0]):
                error.args = (_FAILING_ROW.sub("\nDETAIL:  (row redacted by idem-dialects)", args[0]), *args[1:])
            elif args and isinstance(args[0], dict) and str(args[0].get("D", "")).startswith("Failing row"):
                error.args = ({k: v for k, v in args[0].items() if k != "D"}, *args[1:])

    def connect_error(self, exc: BaseException) -> IdemError | None:
        url = self.backend.engine.url
        orig: Any = exc.orig if isinstance(exc, DBAPIError) else exc
        no_password = ConnectionConfigError(
            self.backend.name, f"the server asks for a password for user {url.username!r} and none was given",
            "put the password in the URL (postgresql+psycopg://USER:PASSWORD@HOST/DB), in PGPASSWORD or in ~/.pgpass")
        # psycopg 3 knows without a SQLSTATE that the server asked for a password and none was available (libpq's
        # PQconnectionNeedsPassword; its used_password is also true then, so only the password itself tells).
        pgconn = getattr(orig, "pgconn", None)
        if getattr(pgconn, "needs_password", False) and not getattr(pgconn, "password", None):
            return no_password
        code = sqlstate(exc)
        libpq = type(orig).__module__.partition(".")[0] in _LIBPQ_DRIVERS
        if code is None and (libpq or url.password is None):
            # libpq drops the SQLSTATE of a refused startup (wrong database, too many clients, starting up): ask
            # the server the same question once more, by protocol, and read its answer's code. Without a password
            # in the URL, ask every driver's server whether it wants one (pg8000 fails on SCRAM without one with
            # an AttributeError of its own; psycopg2 says "no password supplied" as text only).
            probe = startup_sqlstate(url)
            if probe == PASSWORD_REQUIRED:
                return no_password
            if not libpq:
                return super().connect_error(exc)
            if probe == ACCEPTED:  # the server takes this user and database: libpq refused the URL's own options,
                if url.query.get("target_session_attrs") in _SESSION_KINDS:  # or this server's kind,
                    return CannotConnect(self.backend.name, exc)
                refused = options.refused(self.backend.name, url, exc)
                # or what refused it has passed since (a slot freed after "too many clients"): then the same
                # connect succeeds now, and the failure was the transient one the store retries.
                if refused is None or _connects_now(self.backend.engine):
                    return super().connect_error(exc)
                return refused
            if isinstance(probe, OSError):  # told in words, whatever libpq said
                return socket_problem(self.backend.name, probe)
            code = probe
        if code is not None:
            config = _CONNECT_CONFIG.get(code) or _CONNECT_CONFIG.get(code[:2])
            if config is not None:
                what = config[0].format(user=url.username, database=url.database)
                fix = credentials_fix(config[1], url) if code[:2] == "28" else config[1]
                return ConnectionConfigError(self.backend.name, f"{what} (SQLSTATE {code})", fix)
            if code[:2] in _CONNECT_TRANSIENT_CLASSES or code in _RETRYABLE:
                return CannotConnect(self.backend.name, exc)
        return super().connect_error(exc)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        code = sqlstate(exc)
        if code is not None:
            if code in _RETRYABLE:
                return _RETRYABLE[code]
            if code.startswith(_CONNECTION_CLASS):
                return RetryCause.CONNECTION
        return super().retry_cause(exc)  # a connection SQLAlchemy saw drop (no SQLSTATE: the socket closed)
