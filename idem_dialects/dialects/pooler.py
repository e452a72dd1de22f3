"""A transaction-mode pooler (PgBouncer) that the URL does not declare: found, and the driver's prepared statements
turned off, before they break.

Behind such a pooler a client's next transaction may run on another server session, so a prepared statement a driver
left on one session is missing on the next (SQLSTATE 26000), or one of its name is there already, another client's
(42P05). ``?pooler=transaction`` says so up front (options.py); ``?pooler=session`` says there is nothing to fear.
Without either, for a driver that prepares statements and can tell a pooler (`Driver.behind_pooler`):

- An engine's first connection opens without prepared statements (so nothing it runs, SQLAlchemy's first-connect
  checks included, can meet another client's) and asks: is the server session id the driver was told at connect the
  server's own? If not, a pooler is in front: the backend's features say the session does not last
  (`Features.session_state` False) and every later connection opens without prepared statements. If so, that first
  connection is recycled at its next checkout, with them. Connections opened before the answer go without too, and
  are recycled the same way (asyncpg's tasks opening a new engine's pool at once: else they kept no prepared
  statement for life, each statement prepared in a round trip of its own).
- Should a lost prepared statement be met anyway (`ErrorClassifier.lost_session_state`, e.g. a pooler that passes
  the session id through) on a connection opened with them, the same is learned then: that connection and those
  pooled before it are reopened without (SQLAlchemy's pool invalidation on a disconnect), and the error counts as a
  lost connection, which `run` retries. On a connection opened without them the error is the caller's own.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError

from ..drivers import Driver
from ..features import Features
from . import options
from .classify import ErrorClassifier

log = logging.getLogger("idem_dialects")
UNPREPARED = "idem_dialects.unprepared"  # in a pool record: its connection was opened without prepared statements
_PROBE = "idem_dialects.pooler_probe"  # in a pool record: ask its new connection whether a pooler is in front


class Pooled(Protocol):
    """What the pooler logic reads and sets of its backend (`base.Backend`)."""

    features: Features
    errors: ErrorClassifier

    @property
    def name(self) -> str: ...

    @property
    def url_options(self) -> frozenset[str]: ...


class PreparedStatements:
    """Whether an engine's new connections may keep prepared statements, decided as the module docstring says."""

    def __init__(self, backend: Pooled, driver: Driver, engine: Engine) -> None:
        self.backend = backend
        self.driver = driver
        declared = options.choice(engine.url, options.POOLER, backend.url_options) is not None
        # Nothing to find out: the URL says, or the driver cannot tell (then only a lost statement teaches it).
        self.known = declared or type(driver).behind_pooler is Driver.behind_pooler

    def install(self, engine: Engine) -> None:
        event.listen(engine, "connect", self.connected)
        event.listen(engine, "handle_error", self.failed)

    def connect_params(self, cparams: dict[str, Any], record: Any) -> None:
        """The driver's connect() arguments for a new connection (a `do_connect` listener's part)."""
        if self.backend.features.session_state and self.known:
            return
        self.driver.without_prepared_statements(cparams)
        if record is not None:
            record.info[UNPREPARED] = True
            if not self.known:
                record.info[_PROBE] = True

    def connected(self, dbapi_connection: Any, record: Any) -> None:
        if not record.info.pop(_PROBE, False):
            return
        if self.known:  # opened while another connection asked: once the answer is "no pooler", reopened with them
            if self.backend.features.session_state:
                record.invalidate(soft=True)
            return
        try:
            pooled = self.driver.behind_pooler(dbapi_connection, record.driver_connection)
        except Exception as exc:  # a probe that cannot run decides nothing: a lost statement still would
            log.debug("%s: could not ask whether a pooler is in front (%s)", self.backend.name, type(exc).__name__)
            pooled = None
        self.known = True
        if pooled:
            self.pooler_found("the server session id told at connect is not the server's own")
        elif pooled is not None:
            record.invalidate(soft=True)  # no pooler: reopened, with prepared statements, at its next checkout

    def failed(self, context: ExceptionContext) -> None:
        exc = context.sqlalchemy_exception
        conn = context.connection
        if (not isinstance(exc, DBAPIError) or conn is None or conn.invalidated
                or not self.backend.errors.lost_session_state(exc) or conn.connection.info.get(UNPREPARED)):
            return
        self.pooler_found("a prepared statement of the driver's vanished between transactions")
        context.is_disconnect = True

    def pooler_found(self, why: str) -> None:
        self.known = True
        if self.backend.features.session_state:
            self.backend.features = self.backend.features.replace(session_state=False)
            log.info("%s: %s: a transaction-mode pooler (such as PgBouncer) may be in front of the database, so"
                     " new connections open without prepared statements (?pooler=transaction in the URL says so"
                     " up front; ?pooler=session keeps them)", self.backend.name, why)
