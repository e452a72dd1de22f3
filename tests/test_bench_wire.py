"""The bench's counting proxy (`idem_dialects_bench.wire`): round trips counted exactly for known exchanges (a raw
socket server, then psycopg and PyMySQL on the machine's servers), the latency it adds read from what it recorded
rather than from a wall clock, and the bench's reports carrying the round trips of each mode on the wire."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from idem_dialects_bench.wire import Counts, Wire

from idem_dialects import engines
from idem_dialects.cli import main
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


def test_driver_round_trips_on_the_wire(db_server: Server) -> None:
    """SELECT 1 in autocommit is one round trip on both; in a transaction, psycopg sends BEGIN first (3 with the
    COMMIT), PyMySQL relies on the server's implicit transaction (2)."""
    from idem_dialects_bench.wire import through_proxy

    with through_proxy(db_server.url) as wire:
        conn, in_transactions = connect(db_server, wire)
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
    postgresql = db_server.url.get_backend_name() == "postgresql"
    assert (alone.counts.round_trips, transaction.counts.round_trips) == (1, 3 if postgresql else 2)
    assert alone.counts.connections == transaction.counts.connections == 0


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(["bench", *argv, "--format", "json", "--quiet"])
    out, err = capsys.readouterr()
    if code == 2 and "unavailable" in err:
        pytest.skip(err.strip())
    assert code == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


# Round trips per request on the wire at one worker, steady state: the statements and the COMMIT; on PostgreSQL the
# BEGIN psycopg sends on its own before the bare effect's and the PL/pgSQL function's statements, and the store's
# BEGIN in one query with its claim; MariaDB's pool sends no reset ROLLBACK after the store's COMMIT (from_url's
# engines leave the reset to the backend's hook). Contention at one worker: half first-time, half replays.
WIRE = {"postgresql": {"bare": 4, "first": 5, "replay": 2, "contention": 3.5, "plpgsql_first": 3,
                       "plpgsql_replay": 3},
        "mariadb": {"bare": 3, "first": 5, "replay": 2, "contention": 3.5}}


def test_sync_bench_counts_each_modes_round_trips_on_the_wire(db_server: Server,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    report = bench(capsys, db_server.engine, "--requests", "12", "--repetitions", "1", "--warmup", "10")
    assert report["schema"] == "idem-dialects-bench/2"
    assert report["wire"] == {"counted": True, "why_not": None, "added_latency_ms": 0.0}
    found = {mode: m["round_trips_per_request"] for mode, m in report["modes"].items()}
    assert found == WIRE[db_server.url.get_backend_name()]
    assert not any("added_latency" in m for m in report["modes"].values())  # none asked for


def test_added_latency_pass_reports_throughput_beside_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    report = bench(capsys, "postgresql", "--requests", "8", "--repetitions", "1", "--warmup", "10", "--workers", "2",
                   "--added-latency-ms", "1")
    assert report["config"]["added_latency_ms"] == 1.0 and report["wire"]["added_latency_ms"] == 1.0
    for mode, m in report["modes"].items():
        at = m["added_latency"]
        assert at["ms"] == 1.0 and at["requests"] == 8, mode
        assert at["throughput_per_s"] > 0 and at["ratio_to_loopback"] > 0 and at["latency_ms"]["p50"] > 0
        # What the proxy recorded waiting, per round trip: at least the millisecond asked for (no wall clock read).
        assert at["added_ms_per_round_trip"] >= 1.0, mode
    assert report["modes"]["replay"]["round_trips_per_request"] == 2


def test_async_bench_counts_round_trips_on_the_wire(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("asyncpg", reason="asyncpg (the [asyncpg] extra) is not installed")
    report = bench(capsys, "postgresql", "--api", "async", "--driver", "asyncpg", "--concurrency", "1", "--requests",
                   "12", "--sleep", "0.01", "--added-latency-ms", "1")
    assert report["schema"] == "idem-dialects-bench-async/2" and report["wire"]["counted"]
    modes = report["modes"]
    # asyncpg sends BEGIN on its own; the sync store beside it (psycopg) sends its BEGIN with the claim.
    assert {m: modes[m]["round_trips_per_request"] for m in ("bare", "first", "replay", "sync_first",
                                                             "sync_replay")} == {
        "bare": 4, "first": 6, "replay": 3, "sync_first": 5, "sync_replay": 2}
    assert modes["first"]["added_latency"]["added_ms_per_round_trip"] >= 1.0
    assert modes["sleep_async"]["round_trips_per_request"] is None  # the sleep figure has no pass on the wire


def test_no_wire_on_sqlite_says_why(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    report = bench(capsys, f"sqlite:///{tmp_path / 'bench.db'}", "--requests", "3", "--repetitions", "1",
                   "--warmup", "0", "--added-latency-ms", "1")
    assert report["wire"]["counted"] is False and "inside the client's process" in report["wire"]["why_not"]
    assert all(m["round_trips_per_request"] is None and "added_latency" not in m for m in report["modes"].values())


def test_http_bench_counts_round_trips_on_the_wire(capsys: pytest.CaptureFixture[str]) -> None:
    """Through the middleware on psycopg's async connection: BEGIN, the claim, the debit, the completion, COMMIT for
    a first-time request; BEGIN, the claim that finds the record, COMMIT for a replay."""
    pytest.importorskip("uvicorn", reason="uvicorn (the [dev] extra) is not installed")
    report = bench(capsys, "postgresql", "--api", "http", "--driver", "psycopg", "--concurrency", "1", "--requests",
                   "4", "--repetitions", "1")
    assert report["schema"] == "idem-dialects-bench-http/4" and report["wire"]["counted"]
    found = {p["path"]: p["round_trips_per_request"] for p in report["paths"] if p["workload"] == "throughput"}
    assert found == {"bare": 3, "middleware first-time": 5, "middleware replay": 3}


def test_the_pools_reset_is_a_round_trip_where_the_driver_sends_it() -> None:
    """MySQL's drivers send ROLLBACK whenever the pool resets a connection given back, a transaction open or not: on
    a plain engine that is one more round trip per transaction; from_url's engines leave the reset to MySQLBackend's
    hook, which skips it after the store's own COMMIT."""
    from idem_dialects_bench.wire import through_proxy
    from sqlalchemy import create_engine, text

    from idem_dialects import IdempotencyStore

    try:
        server = engines.get("mariadb").provide()
    except engines.Unavailable as exc:
        pytest.skip(f"mariadb unavailable: {exc}")
    try:
        with through_proxy(server.url) as wire:
            url = wire.reach(server.url)
            plain, store = create_engine(url), IdempotencyStore.from_url(url)
            found = []
            for begin in (plain.begin, store.transaction, plain.begin, store.transaction):
                with wire.window() as window, begin() as conn:  # the first of each: the connection opened
                    conn.execute(text("SELECT 1"))
                found.append(window.counts.round_trips)
            plain.dispose()
            store.close()
    finally:
        server.stop()
    assert found[2:] == [3, 2]  # SELECT, COMMIT, and on the plain engine the reset's ROLLBACK
