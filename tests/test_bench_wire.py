"""The bench's counting proxy (`idem_dialects_bench.wire`): round trips counted exactly for known exchanges (a raw
socket server, then psycopg and PyMySQL on the machine's servers), and the latency it adds read from what it
recorded rather than from a wall clock."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from idem_dialects_bench.wire import Counts, Wire

from idem_dialects import engines
from idem_dialects.engines import Server

# --- a known exchange on a raw socket ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def answering() -> Iterator[tuple[str, int]]:
    """A server that greets each connection unasked, then answers each "?" it reads (however the bytes before it
    arrived) with "!" and "!!" in two writes, and answers nothing else."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.sendall(b"hello")
            while data := conn.recv(4096):
                for _ in range(data.count(b"?")):
                    conn.sendall(b"!")
                    conn.sendall(b"!!")

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()
    server.close()


def ask(sock: socket.socket, *parts: bytes) -> None:
    """Send `parts` one write each (the last ends in "?"), then read the whole answer: one round trip."""
    for part in parts:
        sock.sendall(part)
    got = b""
    while len(got) < 3:
        got += sock.recv(16)
    assert got == b"!!!"


def greeted(wire: Wire) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", wire.port))
    got = b""
    while len(got) < 5:
        got += sock.recv(16)
    return sock


def test_a_burst_answered_by_a_burst_is_one_round_trip(answering: tuple[str, int]) -> None:
    """Pipelined pieces before the reply are one burst, a reply in two writes one answer, the server's greeting no
    round trip, and a last burst nobody answers no round trip either."""
    with Wire(answering) as wire:
        sock = greeted(wire)
        with wire.window() as window:
            for _ in range(7):
                ask(sock, b"a", b"bc", b"?")
            ask(sock, b"?")
        assert window.counts == Counts(round_trips=8, bursts=8, delayed_s=0.0, connections=0)
        before = wire.counts()
        sock.sendall(b"bye")  # no "?": nothing answers it
        deadline = time.monotonic() + 30
        while (now := wire.counts()).bursts == before.bursts and time.monotonic() < deadline:
            time.sleep(0.01)
        sock.close()
    assert (now - before) == Counts(round_trips=0, bursts=1, delayed_s=0.0, connections=0)


def test_added_latency_is_waited_once_per_round_trip(answering: tuple[str, int]) -> None:
    """Counted, not timed: the proxy measures each wait it makes, and time.sleep waits at least what is asked, so
    the record holds on a busy machine too."""
    with Wire(answering, added_latency_ms=2.0) as wire:
        sock = greeted(wire)
        with wire.window() as window:
            for _ in range(5):
                ask(sock, b"x", b"?")
        sock.close()
    counts = window.counts
    assert counts.round_trips == counts.bursts == 5
    assert counts.delayed_s >= 5 * 0.002


def test_negative_latency_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 0 ms"):
        Wire(("127.0.0.1", 1), added_latency_ms=-1)


# --- drivers on the machine's servers ------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["postgresql", "mariadb"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    try:
        found = engines.get(request.param).provide()
    except engines.Unavailable as exc:
        pytest.skip(f"{request.param} unavailable: {exc}")
    yield found
    found.stop()


def connect(server: Server, wire: Wire) -> tuple[Any, Any]:
    """A DB-API connection of the server's default driver (psycopg, PyMySQL) through the proxy, in autocommit mode,
    and how to turn that off."""
    url = wire.reach(server.url)
    if url.get_backend_name() == "postgresql":
        import psycopg

        conn = psycopg.connect(host=url.host, port=url.port, user=url.username, password=url.password or "",
                               dbname=url.database, sslmode="disable", autocommit=True)
        return conn, lambda: setattr(conn, "autocommit", False)
    import pymysql

    conn = pymysql.connect(host=url.host, port=url.port, user=url.username, password=url.password or "",
                           database=url.database, autocommit=True)
    return conn, lambda: conn.autocommit(False)


def test_driver_round_trips_on_the_wire(server: Server) -> None:
    """SELECT 1 in autocommit is one round trip on both; in a transaction, psycopg sends BEGIN first (3 with the
    COMMIT), PyMySQL relies on the server's implicit transaction (2)."""
    from idem_dialects_bench.wire import through_proxy

    with through_proxy(server.url) as wire:
        conn, in_transactions = connect(server, wire)
        try:
            with wire.window() as alone:
                with conn.cursor() as cursor:
                    cursor.execute("SELECT 1")
                    assert cursor.fetchall()[0][0] == 1
            in_transactions()
            with wire.window() as transaction:
                with conn.cursor() as cursor:
                    cursor.execute("SELECT 1")
                    cursor.fetchall()
                conn.commit()
        finally:
            conn.close()
    postgresql = server.url.get_backend_name() == "postgresql"
    assert (alone.counts.round_trips, transaction.counts.round_trips) == (1, 3 if postgresql else 2)
    assert alone.counts.connections == transaction.counts.connections == 0
