"""MySQL's and MariaDB's pool reset: the ROLLBACK SQLAlchemy's pool sends when a connection comes back, sent only
when the connection may hold a transaction (`MySQLBackend` installs the hook on the pools of engines it builds)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.pool import Pool, PoolResetState
from sqlalchemy.pool.base import ResetStyle  # not re-exported; tests/test_statement_counts.py fails if it moves

# Set in Connection.info (the pool record's) once the store's COMMIT succeeded; the pool's reset hook pops it.
_COMMITTED_CLEAN = "idem_dialects.committed_clean"
SERVER_STATUS_IN_TRANS = 1  # the server's status flag (OK/EOF packets): a transaction is open on the session


def _reset_unless_clean(dbapi_connection: Any, record: Any, state: PoolResetState) -> None:
    """The pool's reset on return, minus the ROLLBACK round trip when the connection is known to be clean: the
    store's own transaction committed last and (where the driver reports it, as PyMySQL does) the server's last
    status shows no transaction open. Anything else (application code, a failed commit) is rolled back."""
    clean = record is not None and record.info.pop(_COMMITTED_CLEAN, False)
    if state.terminate_only or state.transaction_was_reset or not state.asyncio_safe:
        return  # discarded, or the Connection already rolled its transaction back
    status = getattr(dbapi_connection, "server_status", None)
    if clean and not (isinstance(status, int) and status & SERVER_STATUS_IN_TRANS):
        return
    dbapi_connection.rollback()


def resets_by_hook(pool: Pool) -> bool:
    """The pool resets nothing itself (pool_reset_on_return=None, what `engine_options` asks for), so a returned
    connection is rolled back only by `_reset_unless_clean`, and only when it is not known clean. Pool has no public
    accessor for its reset style; tests/test_statement_counts.py fails if this private one moves."""
    return getattr(pool, "_reset_on_return", None) is ResetStyle.reset_none
