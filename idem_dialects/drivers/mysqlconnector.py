"""MySQL Connector/Python (``mysql+mysqlconnector://``): its client-side errors carry errno -1, and its `autocommit`
property asks the server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import event

from . import Driver
from .pymysql import AUTOCOMMIT, escaped_size

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import ExceptionContext


def _client_side_disconnect(context: ExceptionContext) -> None:
    """mysql-connector-python raises client-side errors with errno -1, among them "MySQL Connection not available"
    after the server or the network dropped the socket, which SQLAlchemy's disconnect test (matching older wording)
    misses. For such an error ask the driver whether the connection still lives; if not, SQLAlchemy invalidates it
    and `run` retries on a fresh one, as for any lost connection."""
    if context.is_disconnect or getattr(context.original_exception, "errno", None) != -1:
        return
    conn = context.connection
    driver = None if conn is None or conn.closed or conn.invalidated else conn.connection.driver_connection
    is_connected = getattr(driver, "is_connected", None)
    if callable(is_connected) and not is_connected():
        context.is_disconnect = True


class MySQLConnector(Driver):
    def install(self, engine: Engine) -> None:
        if not event.contains(engine, "handle_error", _client_side_disconnect):
            event.listen(engine, "handle_error", _client_side_disconnect)

    def sent_size(self, value: bytes) -> int:
        return escaped_size(value)  # an escaped string literal (a hex one in a few Asian charsets: no longer)

    def autocommit_on(self, dbapi_connection: Any) -> bool | None:
        # Its `autocommit` property asks the server (a round trip); it keeps the value it set here.
        own = getattr(dbapi_connection, "_autocommit", None)
        return own if isinstance(own, bool) else None


DRIVER = MySQLConnector("mysqlconnector", "mysql.connector", "mysql-connector-python", autocommit_args=AUTOCOMMIT,
                        native=True)
