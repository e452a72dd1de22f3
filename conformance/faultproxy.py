"""A loopback-only TCP fault proxy for the conformance suite: it sits between a store and its database server,
reads enough of the PostgreSQL or MySQL wire protocol to see each statement the client sends, and injects one
fault at a chosen statement (hand-written rather than a generic TCP fault tool such as toxiproxy: only a proxy that
reads the protocol can fault at one chosen statement, e.g. lose exactly a COMMIT's reply):

- ``cut_before``: close both sides without forwarding the statement (a dropped COMMIT never reaches the server);
- ``cut_after``: forward the statement, deliver its reply, then close (the next statement finds the link gone);
- ``lose_reply``: forward the statement, wait for the server's reply and throw it away, then close (a COMMIT
  that happened, whose acknowledgement the client never sees).

Statements are what the client asks the server to run: PostgreSQL simple queries ('Q'; an `EXECUTE` of a statement
prepared by SQL, as the sync store sends its claim with its BEGIN, read as the text that `PREPARE` gave it) and
extended-protocol executes ('E', with the text of the 'P' parse its portal was bound to); MySQL COM_QUERY (0x03) and
COM_STMT_EXECUTE (0x17, with the text of the COM_STMT_PREPARE it runs, the server numbering prepares 1, 2, ... per
session). TLS is not spoken: point the client at the proxy without it (``sslmode=disable``; PyMySQL without ssl).
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import make_url
from sqlalchemy.engine import URL

from idem_dialects.engines.entry import provisioning
from idem_dialects.engines.local import LoopbackProxy, connect_to

Action = Literal["cut_before", "cut_after", "lose_reply"]
_PG_SSL, _PG_GSSENC, _PG_CANCEL = 80877103, 80877104, 80877102
_REPLY_WAIT = 10.0  # seconds to wait for the server's reply to a statement whose reply is to be lost or passed


@dataclass
class Fault:
    """Fire `action` at the `nth` statement (counted over every connection) for which `match(sql)` is true."""

    action: Action
    match: Callable[[str], bool]
    nth: int = 1
    seen: int = 0
    fired: str | None = field(default=None)  # the statement it fired at


def statement(pattern: str) -> Callable[[str], bool]:
    """A case-insensitive regex matched at the start of the statement (after leading blanks)."""
    compiled = re.compile(r"\s*(?:" + pattern + ")", re.IGNORECASE)
    return lambda sql: compiled.match(sql) is not None


class _PostgreSQL:
    """Splits the client's byte stream into messages; yields (statement or None, bytes, ends a round trip)."""

    def __init__(self) -> None:
        self.startup = True
        self.parsed: dict[bytes, str] = {}
        self.portals: dict[bytes, str] = {}
        self.prepared: dict[str, str] = {}  # statements prepared by SQL (PREPARE name AS ...), by name

    def split(self, buf: bytearray) -> list[tuple[str | None, bytes, bool]]:
        out: list[tuple[str | None, bytes, bool]] = []
        while True:
            if self.startup:
                if len(buf) < 8:
                    return out
                (length,) = struct.unpack("!i", buf[:4])
                if len(buf) < length:
                    return out
                (code,) = struct.unpack("!i", buf[4:8])
                self.startup = code in (_PG_SSL, _PG_GSSENC)  # the real startup message follows those
                out.append((None, bytes(buf[:length]), False))
                del buf[:length]
                continue
            if len(buf) < 5:
                return out
            kind = bytes(buf[:1])
            (length,) = struct.unpack("!i", buf[1:5])
            if len(buf) < 1 + length:
                return out
            message, body = bytes(buf[:1 + length]), bytes(buf[5:1 + length])
            del buf[:1 + length]
            sql: str | None = None
            if kind == b"Q":
                sql = self.executed(body.rstrip(b"\0").decode("utf-8", "replace"))
            elif kind == b"P":
                name, _, rest = body.partition(b"\0")
                self.parsed[name] = rest.partition(b"\0")[0].decode("utf-8", "replace")
            elif kind == b"B":
                portal, _, rest = body.partition(b"\0")
                self.portals[portal] = self.parsed.get(rest.partition(b"\0")[0], "")
            elif kind == b"E":
                sql = self.portals.get(body.partition(b"\0")[0], "")
            out.append((sql, message, kind in (b"Q", b"S")))


    def executed(self, query: str) -> str:
        """A simple query as the server runs it: `[PREPARE name AS body; ]BEGIN; EXECUTE name(...)` as
        `BEGIN; body`."""
        found = _PREPARE_EXECUTE.match(query)
        if found is None:
            return query
        name, body, begin, executed = found.groups()
        if name is not None:
            self.prepared[name] = body
        return (begin or "") + self.prepared.get(executed, query)


_PREPARE_EXECUTE = re.compile(r"\s*(?:PREPARE (\w+) AS (.*?); )?(BEGIN; )?EXECUTE (\w+)\(", re.DOTALL)


class _MySQL:
    def __init__(self) -> None:
        self.prepared: list[str] = []

    def split(self, buf: bytearray) -> list[tuple[str | None, bytes, bool]]:
        out: list[tuple[str | None, bytes, bool]] = []
        while len(buf) >= 4:
            length = buf[0] | buf[1] << 8 | buf[2] << 16
            if len(buf) < 4 + length:
                break
            seq, payload, packet = buf[3], bytes(buf[4:4 + length]), bytes(buf[:4 + length])
            del buf[:4 + length]
            sql: str | None = None
            if seq == 0 and payload[:1] == b"\x03":  # COM_QUERY (commands start a sequence; auth packets do not)
                sql = payload[1:].decode("utf-8", "replace")
            elif seq == 0 and payload[:1] == b"\x16":  # COM_STMT_PREPARE
                self.prepared.append(payload[1:].decode("utf-8", "replace"))
            elif seq == 0 and payload[:1] == b"\x17" and len(payload) >= 5:  # COM_STMT_EXECUTE
                (stmt_id,) = struct.unpack("<I", payload[1:5])
                sql = self.prepared[stmt_id - 1] if 0 < stmt_id <= len(self.prepared) else ""
            out.append((sql, packet, True))
        return out


# The wire protocols the proxy reads, by the name a backend's provisioning gives (`Provision.wire_protocol`).
PROTOCOLS: dict[str, Callable[[], _PostgreSQL | _MySQL]] = {"postgresql": _PostgreSQL, "mysql": _MySQL}


def wire_protocol(url: URL) -> str | None:
    """The protocol the proxy would read for `url`'s server, or None if it reads none of that backend's."""
    protocol = provisioning(url.get_backend_name()).wire_protocol
    return protocol if protocol in PROTOCOLS else None


class FaultProxy(LoopbackProxy):
    """Forwards 127.0.0.1:`port` to the server of `url`, injecting the armed fault (one at a time, once)."""

    def __init__(self, url: str | URL) -> None:
        url = make_url(url)
        protocol = wire_protocol(url)
        if protocol is None:
            raise NotImplementedError(f"the fault proxy reads the {' and '.join(PROTOCOLS)} wire protocols, not"
                                      f" {url.get_backend_name()}'s")
        self.url = url
        self.provision = provisioning(url.get_backend_name())
        self.protocol = PROTOCOLS[protocol]
        self.upstream = self.provision.server_address(url)
        self._fault: Fault | None = None
        self._down = False
        self.statements: list[str] = []
        super().__init__("faultproxy-accept")

    def proxied_url(self) -> URL:
        """`url` pointed at the proxy, without TLS (the proxy must read the protocol)."""
        return self.provision.plaintext_url(self.url, "127.0.0.1", self.port)

    def arm(self, fault: Fault) -> Fault:
        with self._lock:
            self._fault = fault
        return fault

    def set_down(self, down: bool) -> None:
        """An outage of the server, as its clients see a crash or a failover: while down, every live link is cut and
        every new connection dropped at once; then the server is reachable again."""
        with self._lock:
            self._down = down
            links = list(self._open) if down else []
        for sock in links:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # --- plumbing -------------------------------------------------------------------------------------------

    def _connect(self) -> socket.socket:
        if self._down:
            raise ConnectionRefusedError("the fault proxy's server is down")
        return connect_to(self.upstream)

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        _Link(self, client, upstream).start()

    def _due(self, sql: str) -> Fault | None:
        """The armed fault if it fires at this statement (then disarmed)."""
        with self._lock:
            self.statements.append(sql)
            fault = self._fault
            if fault is None or not fault.match(sql):
                return None
            fault.seen += 1
            if fault.seen < fault.nth:
                return None
            fault.fired = sql
            self._fault = None
            return fault


class _Link:
    """One client connection: client->server parsed and forwarded, server->client forwarded unless swallowed."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.parser = proxy.protocol()
        self.swallow = False
        self.replied = threading.Event()
        self.pending: Action | None = None  # a fault waiting for the end of the round trip it fired in

    def start(self) -> None:
        threading.Thread(target=self._upstream, daemon=True, name="faultproxy-up").start()
        threading.Thread(target=self._downstream, daemon=True, name="faultproxy-down").start()

    def _upstream(self) -> None:
        buf = bytearray()
        try:
            while data := self.client.recv(65536):
                buf += data
                for sql, message, round_trip_end in self.parser.split(buf):
                    fault = self.proxy._due(sql) if sql is not None else None
                    if fault is not None and fault.action == "cut_before":
                        return
                    if fault is not None:
                        self.pending = fault.action
                        self.swallow = fault.action == "lose_reply"
                    if self.pending is not None and round_trip_end:
                        self.replied.clear()
                        self.server.sendall(message)
                        self.replied.wait(_REPLY_WAIT)  # the server answered: the statement ran (e.g. committed)
                        return
                    self.server.sendall(message)
        except OSError:
            return
        finally:
            self._close()

    def _downstream(self) -> None:
        try:
            while data := self.server.recv(65536):
                if not self.swallow:
                    self.client.sendall(data)
                if self.pending is not None:
                    self.replied.set()
        except OSError:
            pass
        finally:
            self.replied.set()
            self._close()

    def _close(self) -> None:
        self.proxy._forget(self.client, self.server)
