"""pg8000 (``postgresql+pg8000://``): raises ProgrammingError for every server error but 23505, and leaks the socket
of a connection its server dropped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.exc import DBAPIError, IntegrityError

from . import Driver, hex_size

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import ExceptionContext


def _sqlstate(orig: Any) -> str:
    args = getattr(orig, "args", ())
    code = args[0].get("C") if args and isinstance(args[0], dict) else None
    return code if isinstance(code, str) else ""


def _integrity_errors(context: ExceptionContext) -> BaseException | None:
    """pg8000 raises ProgrammingError for every server error but 23505 (and 28000), so a NOT NULL, CHECK or foreign
    key violation would not be an IntegrityError as PEP 249 and every other driver have it: re-raise SQLSTATE class
    23 (integrity_constraint_violation) as SQLAlchemy's IntegrityError, same driver error, same message."""
    exc = context.sqlalchemy_exception
    if (isinstance(exc, DBAPIError) and exc.orig is not None and not isinstance(exc, IntegrityError)
            and _sqlstate(exc.orig).startswith("23")):
        return IntegrityError(exc.statement, exc.params, exc.orig, hide_parameters=exc.hide_parameters,
                              connection_invalidated=exc.connection_invalidated)
    return None


class Pg8000(Driver):
    def sent_size(self, value: bytes) -> int:
        return hex_size(value)  # every parameter as text: bytea as \x and two hex digits a byte

    def install(self, engine: Engine) -> None:
        if not event.contains(engine, "handle_error", _integrity_errors):
            event.listen(engine, "handle_error", _integrity_errors)


# pg8000 1.31: close() after a lost connection fails writing Terminate and never closes its socket file.
DRIVER = Pg8000("pg8000", "pg8000", "pg8000", leaks_lost_sockets=True, native=True)
