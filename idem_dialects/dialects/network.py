"""Connect failures below the driver: the socket error a driver raised as it is (asyncpg) or chained under its own
error (PyMySQL's ``original_exception``, pg8000, mysql-connector and asyncmy as ``__cause__``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

from ..errors import CannotConnect, ConnectionConfigError, IdemError

# getaddrinfo answers that no retry changes: the name does not exist (as opposed to EAI_AGAIN, a DNS hiccup).
_UNKNOWN_NAME = frozenset(code for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None),
                                            getattr(socket, "EAI_SERVICE", None)) if code is not None)


def causes(exc: BaseException, depth: int = 8) -> Iterator[BaseException]:
    """`exc`, then what it wraps: SQLAlchemy's ``orig``, PyMySQL's ``original_exception``, ``__cause__`` and
    ``__context__`` (each once)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < depth:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for nested in (getattr(current, "orig", None), getattr(current, "original_exception", None),
                       current.__cause__, current.__context__):
            if isinstance(nested, BaseException):
                todo.append(nested)


def socket_error(exc: BaseException) -> OSError | None:
    """The socket-level error under a failed connect, if there is one."""
    return next((e for e in causes(exc) if isinstance(e, OSError)), None)


def socket_problem(backend: str, exc: BaseException) -> IdemError | None:
    """A host name that does not resolve is a configuration error; any other socket error (refused, reset, timed
    out, no socket file yet) is transient, told in plain words rather than the driver's text; None when no socket
    error lies under `exc`."""
    error = socket_error(exc)
    if error is None:
        return None
    if isinstance(error, socket.gaierror) and error.errno in _UNKNOWN_NAME:
        return ConnectionConfigError(backend, "the host name in the URL does not resolve",
                                     "check the URL's host (or the DNS / /etc/hosts entry for it)")
    return CannotConnect(backend, exc, described(error))


def described(error: OSError) -> str:
    """A socket error in words: "Connection refused", "Connection timed out", ... (the C library's, without the
    errno and the driver's wrapping)."""
    if error.errno:
        return os.strerror(error.errno)
    return "Connection timed out" if isinstance(error, TimeoutError) else str(error) or type(error).__name__
