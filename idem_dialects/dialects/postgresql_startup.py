"""Why a PostgreSQL server refused a connection, as its SQLSTATE: libpq (psycopg, psycopg2) reports a refused
startup (unknown database or role, too many clients, starting up) as text only, so the dialect asks the server once
more with a bare startup message and reads the code of its ErrorResponse. Only on the failure path, never with a
password: the probe stops where the server asks for one (then its answer stays unknown, and the failure transient)."""

from __future__ import annotations

import getpass
import os
import socket
import ssl
import struct

from sqlalchemy.engine import URL

_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
_PROTOCOL_3 = 196608
_TIMEOUT = 3.0


def _address(url: URL) -> tuple[int, str | tuple[str, int]] | None:
    """(socket family, address) of the one server `url` names; None for a multi-host URL (a failover in progress
    refuses by design: not a configuration error)."""
    host = url.query.get("host")
    port = url.port or 5432
    if url.host:
        return socket.AF_INET, (url.host, port)  # resolved by create_connection below
    if isinstance(host, str) and host.startswith("/") and "," not in host:
        return socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
    if host is None:  # libpq's default: $PGHOST, else Debian's socket directory
        directory = os.environ.get("PGHOST", "/var/run/postgresql")
        return (socket.AF_UNIX, f"{directory}/.s.PGSQL.{port}") if directory.startswith("/") else None
    return None


def _open(family: int, address: str | tuple[str, int]) -> socket.socket:
    if family == socket.AF_INET:
        assert isinstance(address, tuple)
        return socket.create_connection(address, timeout=_TIMEOUT)
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(_TIMEOUT)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    return sock


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        data += chunk
    return data


def startup_sqlstate(url: URL) -> str | OSError | None:
    """The SQLSTATE the server of `url` refuses a startup for `url`'s user and database with; the socket error if
    it cannot be reached (a name that does not resolve, refused); None if it accepts the startup (it asks for a
    password, or lets us in) or cannot be asked (several hosts)."""
    target = _address(url)
    if target is None:
        return None
    user = url.username or os.environ.get("PGUSER") or getpass.getuser()
    try:
        sock = _open(*target)
    except OSError as exc:
        return exc
    try:
        if target[0] == socket.AF_INET and url.query.get("sslmode") != "disable":
            sock.sendall(_SSL_REQUEST)
            if _read(sock, 1) == b"S":  # TLS as libpq's sslmode=prefer: only user and database names cross it
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                sock = context.wrap_socket(sock)
        params = b"".join(f"{k}\0{v}\0".encode() for k, v in (("user", user), ("database", url.database or user)))
        body = struct.pack("!i", _PROTOCOL_3) + params + b"\0"
        sock.sendall(struct.pack("!i", len(body) + 4) + body)
        for _ in range(64):  # AuthenticationOk (trust), then ParameterStatus and BackendKeyData, then E or Z
            kind, length = struct.unpack("!ci", _read(sock, 5))
            body = _read(sock, length - 4)
            if kind == b"E":
                fields = body.split(b"\0")
                return next((f[1:].decode("ascii", "replace") for f in fields if f[:1] == b"C"), None)
            if kind == b"Z" or (kind == b"R" and body[:4] != b"\0\0\0\0"):  # in, or asked for a password
                return None
        return None
    except (OSError, struct.error, ssl.SSLError):
        return None
    finally:
        sock.close()
