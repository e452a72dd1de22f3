"""SQLite's errors, by the result codes sqlite3 (and aiosqlite, raising sqlite3's errors from its thread) exposes
as ``sqlite_errorcode``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sqlalchemy.exc import DBAPIError

from ..errors import ConnectionConfigError, IdemError, RetryCause
from .classify import MISSING_TABLE, NO_PRIVILEGE, ErrorClassifier

# Primary result codes (the low byte of the extended code).
_SQLITE_ERROR = 1  # the generic code: a missing table has no code of its own
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_CANTOPEN = 14
# Extended constraint codes: only these two are duplicates; NOT NULL (1299), CHECK (275), FK (787) are not.
_SQLITE_CONSTRAINT_PRIMARYKEY = 1555
_SQLITE_CONSTRAINT_UNIQUE = 2067


def result_code(exc: BaseException) -> int | None:
    """The extended result code of an sqlite3 error, wrapped by SQLAlchemy or not."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    code = getattr(orig, "sqlite_errorcode", None)
    return code if isinstance(code, int) else None


def is_read_only(exc: BaseException) -> bool:
    return (result_code(exc) or 0) & 0xFF == _SQLITE_READONLY


class SQLiteErrors(ErrorClassifier):
    def is_duplicate(self, exc: DBAPIError) -> bool:
        return result_code(exc) in (_SQLITE_CONSTRAINT_PRIMARYKEY, _SQLITE_CONSTRAINT_UNIQUE)

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        return (result_code(exc) or 0) & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)

    def config_problem(self, exc: DBAPIError, tables: Sequence[str], dbapi_connection: Any) -> str | None:
        code = result_code(exc)
        if code is not None and code & 0xFF == _SQLITE_READONLY:
            return NO_PRIVILEGE
        if code != _SQLITE_ERROR or not tables or dbapi_connection is None:
            return None
        # SQLITE_ERROR is every kind of SQL error: ask the database whether the statement's tables exist.
        cursor = dbapi_connection.cursor()
        try:
            marks = ",".join("?" * len(tables))
            cursor.execute(f"SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ({marks})",
                           list(tables))
            row: Any = cursor.fetchone()
            found = int(row[0])
        finally:
            cursor.close()
        return MISSING_TABLE if found < len(set(tables)) else None

    def connect_error(self, exc: BaseException) -> IdemError | None:
        # A file that cannot be opened (missing directory, no permission) stays so: no retry helps.
        if result_code(exc) == _SQLITE_CANTOPEN:
            url = self.backend.engine.url
            path = url.database or ""
            if url.query.get("uri") and path.startswith("file:"):
                path = unquote(path[len("file:"):].partition("?")[0])
                missing = not Path(path).exists() and Path(path).absolute().parent.is_dir()
                if url.query.get("mode") == "rw" and missing:  # existing_database_url's form, in a real directory
                    return ConnectionConfigError(self.backend.name, f"the database file {path!r} does not exist",
                                                 "check the path in the URL; `idem-dialects init URL` creates it")
            return ConnectionConfigError(self.backend.name, f"cannot open the database file {path!r}",
                                         "check that its directory exists and is writable")
        return super().connect_error(exc)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        if isinstance(exc, DBAPIError) and (result_code(exc) or 0) & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED):
            return RetryCause.BUSY
        return super().retry_cause(exc)
