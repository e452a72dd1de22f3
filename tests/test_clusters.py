"""Cluster engines and the backends' cluster awareness: catalogue entries and their skip reasons, the round-robin
proxy, Galera detection and classification, PostgreSQL multi-host URLs and connection failures during failover."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.exc import OperationalError

from idem_dialects import IdempotencyStore
from idem_dialects.cli import main
from idem_dialects.conformance.plugin import EngineUnderTest
from idem_dialects.dialects.mysql import GALERA_SYNC_WAIT, MariaDBBackend, MySQLFeatures
from idem_dialects.dialects.postgresql import PostgreSQLBackend
from idem_dialects.engines import ENGINES, EntryUnavailable, Unavailable, env_var, get, pg_ha
from idem_dialects.engines import galera as galera_engine
from idem_dialects.engines.local import RoundRobinProxy
from idem_dialects.errors import CannotConnect, RetryCause

pymysql = pytest.importorskip("pymysql", reason="PyMySQL is not installed (pip install 'idem-dialects[mysql]')")


@pytest.fixture
def no_cluster_binaries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A machine without mariadbd/galera-4/rsync and without PostgreSQL server binaries."""
    monkeypatch.setattr(galera_engine, "MARIADBD", tmp_path / "mariadbd")
    monkeypatch.setattr(galera_engine, "PROVIDERS", (tmp_path / "libgalera_smm.so",))
    monkeypatch.setattr(pg_ha, "BIN_DIRS", (str(tmp_path),))
    for name in ("galera", "postgresql-ha"):
        monkeypatch.delenv(env_var(name), raising=False)


def test_cluster_engines_are_in_the_catalogue() -> None:
    assert ENGINES["galera"].backend == "mariadb" and ENGINES["postgresql-ha"].backend == "postgresql"


def test_missing_binaries_skip_with_install_hint(no_cluster_binaries: None,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(EntryUnavailable) as err:
        get("galera").provide()
    assert "libgalera_smm.so (galera-4)" in err.value.reasons[-1]
    assert "apt-get install galera-4 rsync" in err.value.hint
    with pytest.raises(EntryUnavailable) as err:
        get("postgresql-ha").provide()
    assert "no PostgreSQL server binaries" in err.value.reasons[-1] and "apt-get install" in err.value.hint
    assert main(["engines", "--probe", "--engine", "galera", "--engine", "postgresql-ha", "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)["engines"]
    assert not found["galera"]["available"] and "galera-4" in found["galera"]["hint"]
    assert not found["postgresql-ha"]["available"] and "initdb" in found["postgresql-ha"]["reason"] + \
        found["postgresql-ha"]["hint"]


@pytest.fixture
def listeners() -> Iterator[list[socket.socket]]:
    socks = []
    for _ in range(3):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        socks.append(sock)
    yield socks
    for sock in socks:
        sock.close()


def _serve_once(sock: socket.socket, tag: bytes) -> threading.Thread:
    def serve() -> None:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        with conn:
            conn.sendall(tag + conn.recv(16))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_proxy_round_robin_and_skips_dead_node(listeners: list[socket.socket]) -> None:
    """One pool through the proxy reaches every node in turn; a node that refuses is skipped, not reported."""
    ports = [s.getsockname()[1] for s in listeners]
    listeners[1].close()  # node 2 is down
    proxy = RoundRobinProxy([("127.0.0.1", p) for p in ports])
    try:
        seen = []
        for _ in range(2):
            for i in (0, 2):
                _serve_once(listeners[i], f"node{i + 1}:".encode())
            for _ in range(2):
                with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
                    client.sendall(b"hi")
                    seen.append(client.recv(64))
        assert sorted(seen) == [b"node1:hi", b"node1:hi", b"node3:hi", b"node3:hi"]
        assert proxy.connections == [2, 0, 2]
    finally:
        proxy.close()


def _mysql_error(code: int) -> OperationalError:
    return OperationalError("COMMIT", {}, pymysql.err.OperationalError(code, "test"))


def test_galera_errors_are_their_own_causes() -> None:
    """On a Galera node 1213 is a lost certification and 1047 a node outside the primary component; elsewhere
    1213 stays a deadlock."""
    backend = MariaDBBackend(create_engine("mariadb+pymysql://u@localhost/db"))
    assert backend.retry_cause(_mysql_error(1213)) == RetryCause.DEADLOCK
    assert backend.retry_cause(_mysql_error(1047)) not in (None, RetryCause.NODE_NOT_READY)  # a refused statement
    backend.features = backend.features.replace(wsrep=True, exclusive_claim=False)
    assert backend.retry_cause(_mysql_error(1213)) == RetryCause.CERTIFICATION
    assert backend.retry_cause(_mysql_error(1047)) == RetryCause.NODE_NOT_READY
    assert backend.retry_cause(_mysql_error(1062)) is None


def test_live_mariadb_features(idem_engine: EngineUnderTest) -> None:
    """A Galera node is detected from wsrep_on (claims not exclusive; wsrep_sync_wait covering INSERT on claim
    connections); a single MariaDB server keeps exclusive claims and its session setting."""
    if idem_engine.backend != "mariadb":
        pytest.skip(f"{idem_engine.name} is not a MariaDB engine")
    # The server's sync URL: an async column (mariadb-asyncmy) runs on the same server through the async store.
    store = IdempotencyStore.from_url(idem_engine.server.url, table_prefix="idem_probe_")
    try:
        with store.transaction() as conn:
            features = store.features
            assert isinstance(features, MySQLFeatures)
            sync_wait = int(conn.exec_driver_sql("SELECT @@SESSION.wsrep_sync_wait").scalar_one())
        if idem_engine.server.controls is not None:  # the galera engine
            assert features.wsrep and features.multi_primary and not features.exclusive_claim
            assert sync_wait & GALERA_SYNC_WAIT == GALERA_SYNC_WAIT and sync_wait & 4
        else:
            assert not features.wsrep and not features.multi_primary and features.exclusive_claim and sync_wait == 0
    finally:
        store.close()


def test_lone_postgresql_has_no_synchronous_standby(idem_engine: EngineUnderTest) -> None:
    if idem_engine.backend != "postgresql" or idem_engine.server.controls is not None:
        pytest.skip(f"{idem_engine.name} is not a lone PostgreSQL server")
    assert not idem_engine.features.synchronous_standby and not idem_engine.features.multi_primary


def test_synchronous_standby_is_detected() -> None:
    """A primary with a synchronous standby has the synchronous_standby feature (read from its settings); the
    standby promoted after the primary's death has none of its own, and so neither has the feature."""
    try:
        server = pg_ha.postgresql_ha(get("postgresql-ha"))
    except Unavailable as exc:
        pytest.skip(f"postgresql-ha unavailable: {exc}")
    try:
        assert server.controls is not None
        with IdempotencyStore.from_url(server.url, table_prefix="idem_probe_") as store:
            with store.transaction():
                assert store.features.synchronous_standby and not store.features.multi_primary
        server.controls.kill()
        server.controls.promote()
        with IdempotencyStore.from_url(server.url, table_prefix="idem_probe_") as store:
            with store.transaction():
                assert not store.features.synchronous_standby and store.features.exclusive_claim
    finally:
        server.stop()


@pytest.mark.parametrize(("given", "expected"), [
    ("postgresql+psycopg://u@/db?host=a:5432,b:5433&target_session_attrs=read-write",
     "postgresql+psycopg://u@/db?host=a%3A5432&host=b%3A5433&target_session_attrs=read-write"),
    ("postgresql+psycopg://u@/db?host=a:5432&host=b:5433", "postgresql+psycopg://u@/db?host=a%3A5432&host=b%3A5433"),
    ("postgresql+psycopg://u@/db?host=a,b&port=5432,5433", "postgresql+psycopg://u@/db?host=a%2Cb&port=5432%2C5433"),
    ("postgresql+psycopg://u@h:5432/db", "postgresql+psycopg://u@h:5432/db"),
])
def test_multi_host_urls(given: str, expected: str) -> None:
    assert PostgreSQLBackend.resolve_url(make_url(given)).render_as_string() == expected


def test_connection_not_established_during_failover_is_retried() -> None:
    """During a failover no host of a multi-host URL takes writes for a moment: the connection attempt fails before
    any statement ran, which `run` retries within its budget (RetryCause.CONNECT)."""
    backend = PostgreSQLBackend(create_engine("postgresql+psycopg://u@localhost/db"))
    refused = OperationalError(None, None, Exception("connection failed: session is read-only"))  # type: ignore[arg-type]
    problem = backend.connect_error(refused)
    assert isinstance(problem, CannotConnect) and problem.cause == RetryCause.CONNECT
