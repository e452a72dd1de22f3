"""Why a PostgreSQL server refused a connection, as its SQLSTATE: libpq (psycopg, psycopg2) reports a refused
startup (unknown database or role, wrong password, too many clients, starting up) as text only, so the dialect asks
the server once more with a bare startup message and reads the code of its ErrorResponse. Only on the failure path;
where the server asks for a password, the probe answers with the URL's (the one the driver just sent: cleartext, MD5
or SCRAM-SHA-256, without channel binding), so a wrong password reads as 28P01 and an unknown database behind password
authentication as 3D000. Without a password, the answer is that one is needed (PASSWORD_REQUIRED); for another
method (GSSAPI, SSPI) it stays unknown."""

from __future__ import annotations

import base64
import getpass
import hashlib
import hmac
import os
import secrets
import socket
import ssl
import struct

from sqlalchemy.engine import URL

_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
# What `startup_sqlstate` answers when the server asks for a password and neither the URL nor PGPASSWORD has one
# (libpq says "fe_sendauth: no password supplied", without a SQLSTATE: the server sent none, it only asked).
PASSWORD_REQUIRED = "password required"
# What it answers when the server accepts the startup (so a failure was the client's: its options, its TLS settings).
ACCEPTED = "accepted"
_PASSWORD_REQUESTS = (3, 5, 10)  # cleartext, MD5, SASL (SCRAM)
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


def _leave(sock: socket.socket) -> None:
    """End an accepted session and wait for the server to close its side: the backend leaves the server's process
    array (its connection slot free again) before it closes the socket, so whoever connects next, such as the
    check that follows an accepted probe, does not meet "too many connections" caused by this probe's session."""
    try:
        sock.sendall(_message(b"X", b""))
        while sock.recv(4096):
            pass
    except OSError:  # closed without TLS's close_notify, or not within the timeout: the answer stands
        pass


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


class _Scram:
    """The client side of SCRAM-SHA-256 (RFC 5802/7677) as PostgreSQL speaks it: no channel binding, empty user name
    (the server takes the startup's)."""

    def __init__(self, password: str) -> None:
        self.password = password
        self.nonce = base64.b64encode(secrets.token_bytes(18)).decode()
        self.first_bare = f"n=,r={self.nonce}"

    def initial(self) -> bytes:
        data = f"n,,{self.first_bare}".encode()
        return _message(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(data)) + data)

    def final(self, server_first: bytes) -> bytes | None:
        fields = dict(part.split("=", 1) for part in server_first.decode().split(",") if "=" in part)
        if not fields.get("r", "").startswith(self.nonce) or "s" not in fields or "i" not in fields:
            return None
        salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(), base64.b64decode(fields["s"]),
                                     int(fields["i"]))
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        without_proof = f"c=biws,r={fields['r']}"  # biws: base64 of the gs2 header "n,,"
        auth = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.digest(hashlib.sha256(client_key).digest(), auth, "sha256")
        proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()
        return _message(b"p", f"{without_proof},p={proof}".encode())


def _answer(request: int, data: bytes, user: str, password: str | None, scram: list[_Scram]) -> bytes | None:
    """The reply to an authentication request (R message `request` with `data`), or None to stop asking."""
    if password is None:
        return None
    if request == 3:  # cleartext
        return _message(b"p", password.encode() + b"\0")
    if request == 5:  # MD5 with a 4-byte salt
        inner = hashlib.md5(password.encode() + user.encode()).hexdigest().encode()
        return _message(b"p", b"md5" + hashlib.md5(inner + data[:4]).hexdigest().encode() + b"\0")
    if request == 10 and b"SCRAM-SHA-256\0" in data + b"\0":  # SASL: the mechanisms the server offers
        scram.append(_Scram(password))
        return scram[0].initial()
    if request == 11 and scram:  # SASL continue: the server-first message
        return scram[0].final(data)
    return None


def startup_sqlstate(url: URL) -> str | OSError | None:
    """The SQLSTATE the server of `url` refuses a startup for `url`'s user, password and database with; the socket
    error if it cannot be reached (a name that does not resolve, refused); PASSWORD_REQUIRED if it asks for a password
    the URL (and PGPASSWORD) lacks; ACCEPTED if it accepts the startup; None if it cannot be asked (several hosts; an
    authentication method not spoken here)."""
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
        password = url.password if url.password is not None else os.environ.get("PGPASSWORD")
        scram: list[_Scram] = []
        for _ in range(64):  # authentication, AuthenticationOk, ParameterStatus and BackendKeyData, then E or Z
            kind, length = struct.unpack("!ci", _read(sock, 5))
            body = _read(sock, length - 4)
            if kind == b"E":
                fields = body.split(b"\0")
                return next((f[1:].decode("ascii", "replace") for f in fields if f[:1] == b"C"), None)
            if kind == b"Z":  # in: the startup itself is accepted
                _leave(sock)
                return ACCEPTED
            if kind == b"R":
                request = struct.unpack("!i", body[:4])[0]
                if request in (0, 12):  # AuthenticationOk; SASL final (the server's signature, then Ok or E)
                    continue
                if password is None and request in _PASSWORD_REQUESTS:
                    return PASSWORD_REQUIRED
                reply = _answer(request, body[4:], user, password, scram)
                if reply is None:
                    return None
                sock.sendall(reply)
        return None
    except (OSError, struct.error, ssl.SSLError):
        return None
    finally:
        sock.close()
