"""Oracle's errors, by the driver's numeric error code (``exc.orig.args[0].code``), never by message text;
``full_code`` is not used either, since the driver parses it out of the message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import DBAPIError

from ..errors import CannotConnect, ConnectionConfigError, IdemError, RetryCause
from .classify import MISSING_TABLE, NO_PRIVILEGE, ErrorClassifier, credentials_fix
from .network import socket_problem

# Oracle error numbers (``_Error.code``), as the server sends them.
ORA_UNIQUE_VIOLATED = 1  # ORA-00001: unique constraint violated -- the only duplicate
ORA_RESOURCE_BUSY = 54  # ORA-00054: resource busy and acquire with NOWAIT specified or timeout expired
ORA_DEADLOCK = 60  # ORA-00060: deadlock detected; only the one statement was rolled back
ORA_CANNOT_SERIALIZE = 8177  # ORA-08177: can't serialize access for this transaction
ORA_LOCK_WAIT_TIMEOUT = 30006  # ORA-30006: resource busy; acquire with WAIT timeout expired
ORA_NAME_USED = 955  # ORA-00955: name is already used by an existing object (a concurrent CREATE TABLE/INDEX)
ORA_NO_TABLE = 942  # ORA-00942: table or view does not exist
ORA_NO_PRIVILEGE = 1031  # ORA-01031: insufficient privileges
# Not duplicates, and not retryable: ORA-01400 (NOT NULL), ORA-02290 (CHECK), ORA-02291/02292 (foreign key).
_RETRYABLE = {
    ORA_CANNOT_SERIALIZE: RetryCause.SERIALIZATION,
    ORA_DEADLOCK: RetryCause.DEADLOCK,
    ORA_RESOURCE_BUSY: RetryCause.BUSY,
    ORA_LOCK_WAIT_TIMEOUT: RetryCause.LOCK_TIMEOUT,
}

# Opening a connection: ORA numbers only a changed configuration fixes, and ones a retry may outlast.
_CONNECT_CONFIG = {
    1017: ("invalid user name or password (ORA-01017)", "check the user and password in the URL"),
    28000: ("the account is locked (ORA-28000)", "unlock it or use another account"),
    12514: ("the listener does not know the service (ORA-12514)", "check ?service_name= in the URL"),
    12505: ("the listener does not know the SID (ORA-12505)", "check the SID or use ?service_name="),
}
_CONNECT_TRANSIENT = frozenset({
    1033, 1034, 1089,  # starting up or shutting down, not available, immediate shutdown in progress
    12170, 12516, 12519, 12520, 12528, 12537, 12541, 12543,  # timeouts, no handler, blocked, closed, no listener
})
# python-oracledb thin's own connect errors (code 0, full_code DPY-...): cannot connect, listener refused, closed;
# and its spelling of ORA-12514/ORA-12505 (thin mode asks the listener itself).
_DPY_CONNECT = frozenset({"DPY-6005", "DPY-6000", "DPY-4011"})
_DPY_CONFIG = {"DPY-6001": _CONNECT_CONFIG[12514], "DPY-6003": _CONNECT_CONFIG[12505]}

def ora_code(exc: BaseException) -> int | None:
    """The Oracle error number of a driver error (wrapped by SQLAlchemy or not), or None if it has none."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    args = getattr(orig, "args", None)
    if not args:
        return None
    code = getattr(args[0], "code", None)  # oracledb raises Error(_Error): the number comes from the wire
    if isinstance(code, bool) or not isinstance(code, int) or code <= 0:
        return None
    return code


def dpy_code(exc: BaseException) -> str | None:
    """python-oracledb's own error code (``DPY-NNNN``, errors raised by the driver rather than the server)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    args = getattr(orig, "args", None) or (None,)
    code = getattr(args[0], "full_code", None)
    return code if isinstance(code, str) and code.startswith("DPY-") else None


class OracleErrors(ErrorClassifier):
    def is_duplicate(self, exc: DBAPIError) -> bool:
        return ora_code(exc) == ORA_UNIQUE_VIOLATED

    def is_already_created(self, exc: DBAPIError) -> bool:
        return ora_code(exc) == ORA_NAME_USED

    def is_lock_busy(self, exc: DBAPIError) -> bool:
        return ora_code(exc) == ORA_RESOURCE_BUSY

    def config_problem(self, exc: DBAPIError, tables: Sequence[str], dbapi_connection: Any) -> str | None:
        return {ORA_NO_TABLE: MISSING_TABLE, ORA_NO_PRIVILEGE: NO_PRIVILEGE}.get(ora_code(exc) or 0)

    def connect_error(self, exc: BaseException) -> IdemError | None:
        code, dpy = ora_code(exc), dpy_code(exc)
        config = _CONNECT_CONFIG.get(code or 0) or _DPY_CONFIG.get(dpy or "")
        if config is not None:
            what, fix = config
            fix = credentials_fix(fix, self.backend.engine.url) if code == 1017 else fix
            return ConnectionConfigError(self.backend.name, what, fix)
        if code in _CONNECT_TRANSIENT or dpy in _DPY_CONNECT:
            problem = socket_problem(self.backend.name, exc)  # DPY-6005 also wraps a host name that does not resolve
            return problem if problem is not None else CannotConnect(self.backend.name, exc)
        return super().connect_error(exc)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        """ORA-08177, ORA-00060, ORA-00054, ORA-30006 and lost connections. After ORA-00060 Oracle has rolled
        back only the one statement and the session still holds its locks: `run` retries in a new transaction,
        and the failed one is rolled back explicitly when its transaction ends with the error."""
        cause = super().retry_cause(exc)
        if cause is not None:
            return cause
        if isinstance(exc, DBAPIError):
            code = ora_code(exc)
            if code is not None:
                return _RETRYABLE.get(code)
        return None
