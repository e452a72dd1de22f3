"""Cluster engines and the backends' cluster awareness: catalogue entries and their skip reasons, Galera detection
and classification, PostgreSQL multi-host URLs and connection failures during failover."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.exc import OperationalError

from idem_dialects import IdempotencyStore
from idem_dialects.cli import main
from idem_dialects.conformance.plugin import EngineUnderTest
from idem_dialects.dialects.mysql import GALERA_SYNC_WAIT, MariaDBBackend, MySQLFeatures
from idem_dialects.dialects.postgresql import PostgreSQLBackend
from idem_dialects.engines import (
    ENGINES,
    EntryUnavailable,
    Unavailable,
    env_var,
    get,
    haproxy,
    patroni,
    pgbouncer,
    pgserver,
)
from idem_dialects.engines import galera as galera_engine
from idem_dialects.errors import CannotConnect, RetryCause

pymysql = pytest.importorskip("pymysql", reason="PyMySQL is not installed (pip install 'idem-dialects[mysql]')")


STACKS = {  # engine: (what is missing on a bare machine, the package its install hint names)
    "postgresql-patroni": ("patroni (patroni)", "apt-get install patroni etcd-server postgresql-15"),
    "pgbouncer-transaction": ("no pgbouncer binary", "apt-get install pgbouncer postgresql-15"),
    "galera-haproxy-all-writers": ("haproxy (haproxy)", "apt-get install haproxy galera-4 rsync mariadb-server"),
    "galera-haproxy-single-writer": ("haproxy (haproxy)", "apt-get install haproxy galera-4 rsync mariadb-server"),
}


@pytest.fixture
def no_cluster_binaries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A machine without Patroni, etcd, PgBouncer, HAProxy, mariadbd/galera-4/rsync or PostgreSQL server binaries."""
    monkeypatch.setattr(patroni, "ETCD", tmp_path / "etcd")
    monkeypatch.setattr(patroni, "PATRONI", tmp_path / "patroni")
    monkeypatch.setattr(pgbouncer, "PGBOUNCER", (str(tmp_path / "pgbouncer"),))
    monkeypatch.setattr(haproxy, "HAPROXY", tmp_path / "haproxy")
    monkeypatch.setattr(galera_engine, "MARIADBD", tmp_path / "mariadbd")
    monkeypatch.setattr(galera_engine, "PROVIDERS", (tmp_path / "libgalera_smm.so",))
    monkeypatch.setattr(pgserver, "BIN_DIRS", (str(tmp_path),))
    for name in STACKS:
        monkeypatch.delenv(env_var(name), raising=False)


def test_stacks_are_in_the_catalogue_with_their_failover_windows() -> None:
    assert {name: ENGINES[name].backend for name in STACKS} == {
        "postgresql-patroni": "postgresql", "pgbouncer-transaction": "postgresql",
        "galera-haproxy-all-writers": "mariadb", "galera-haproxy-single-writer": "mariadb"}
    # PgBouncer's one server does not fail over, but its crash reaches callers stretched by server_login_retry.
    assert all(ENGINES[name].failover_window for name in STACKS)


def test_missing_binaries_skip_with_install_hint(no_cluster_binaries: None,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for name, (missing, hint) in STACKS.items():
        with pytest.raises(EntryUnavailable) as err:
            get(name).provide()
        assert missing in err.value.reasons[-1] and hint in err.value.hint, (name, err.value)
    engines = [arg for name in STACKS for arg in ("--engine", name)]
    assert main(["engines", "--probe", *engines, "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)["engines"]
    for name, (missing, hint) in STACKS.items():
        assert not found[name]["available"] and missing in found[name]["reason"] and hint in found[name]["hint"]


def test_postgresql_binaries_missing(no_cluster_binaries: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With Patroni and PgBouncer there but no PostgreSQL server binaries, the reason names those."""
    monkeypatch.setattr(patroni, "ETCD", Path("/bin/sh"))
    monkeypatch.setattr(patroni, "PATRONI", Path("/bin/sh"))
    monkeypatch.setattr(pgbouncer, "PGBOUNCER", ("/bin/sh",))
    for name in ("postgresql-patroni", "pgbouncer-transaction"):
        with pytest.raises(EntryUnavailable) as err:
            get(name).provide()
        assert "no PostgreSQL server binaries" in err.value.reasons[-1] and "postgresql-15" in err.value.hint


def _mysql_error(code: int) -> OperationalError:
    return OperationalError("COMMIT", {}, pymysql.err.OperationalError(code, "test"))


def test_the_galera_engines_sessions_run_the_settings_the_docs_give_users() -> None:
    """The suite proves the configuration users are told to run: the session setting of the all-writers URL in
    docs/clusters.md is the one the galera-haproxy engines' URLs carry, and they carry no other."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "clusters.md").read_text()
    documented = [make_url(found) for found in re.findall(r"mariadb\+pymysql://\S+writers=all\S*", text)]
    assert documented, "docs/clusters.md gives no URL for sessions spread over every node"
    for layout in ("all", "single"):
        engine = haproxy.HAProxyGalera(galera=None, layout=layout, port=3306).url(failover_window=10)  # type: ignore[arg-type]
        assert {doc.query.get("init_command") for doc in documented} == {engine.query["init_command"]}
        assert set(engine.query) == {"charset", "init_command", "writers", "failover_window"}


def test_galera_errors_are_their_own_causes() -> None:
    """On a Galera node 1213 is a lost certification and 1047 a node outside the primary component; elsewhere
    1213 stays a deadlock."""
    backend = MariaDBBackend(create_engine("mariadb+pymysql://u@localhost/db"))
    assert backend.errors.retry_cause(_mysql_error(1213)) == RetryCause.DEADLOCK
    # a refused statement
    assert backend.errors.retry_cause(_mysql_error(1047)) not in (None, RetryCause.NODE_NOT_READY)
    backend.features = backend.features.replace(wsrep=True, exclusive_claim=False)
    assert backend.errors.retry_cause(_mysql_error(1213)) == RetryCause.CERTIFICATION
    assert backend.errors.retry_cause(_mysql_error(1047)) == RetryCause.NODE_NOT_READY
    assert backend.errors.retry_cause(_mysql_error(1062)) is None


@pytest.mark.idem_stack  # what a stack is detected as: run on the stacks too
def test_live_mariadb_features(idem_engine: EngineUnderTest) -> None:
    """A Galera node is detected from wsrep_on (wsrep_sync_wait covering INSERT on claim connections; claims not
    exclusive, unless the URL says one node takes every session: writers=single); a single MariaDB server keeps
    exclusive claims and its session setting."""
    if idem_engine.backend != "mariadb":
        pytest.skip(f"{idem_engine.name} is not a MariaDB engine")
    # The server's sync URL: an async column (mariadb-asyncmy) runs on the same server through the async store.
    store = IdempotencyStore.from_url(idem_engine.server.url, table_prefix="idem_probe_")
    try:
        with store.transaction() as conn:
            features = store.features
            assert isinstance(features, MySQLFeatures)
            sync_wait = int(conn.exec_driver_sql("SELECT @@SESSION.wsrep_sync_wait").scalar_one())
        if idem_engine.server.controls is not None:  # a galera-haproxy-* engine
            single = idem_engine.server.url.query.get("writers") == "single"
            assert features.wsrep and features.multi_primary and features.exclusive_claim == single
            assert sync_wait & GALERA_SYNC_WAIT == GALERA_SYNC_WAIT and sync_wait & 4
        else:
            assert not features.wsrep and not features.multi_primary and features.exclusive_claim and sync_wait == 0
    finally:
        store.close()


@pytest.mark.idem_stack  # what a stack is detected as: run on the stacks too
def test_live_postgresql_features(idem_engine: EngineUnderTest) -> None:
    """A Patroni leader in synchronous mode has the synchronous_standby feature (read from the settings Patroni
    sets on it); a lone server, or one behind PgBouncer, has none. None is multi-primary."""
    if idem_engine.backend != "postgresql":
        pytest.skip(f"{idem_engine.name} is not a PostgreSQL engine")
    features = idem_engine.features
    assert features.synchronous_standby == (idem_engine.server.controls is not None)
    assert not features.multi_primary and features.exclusive_claim


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
    problem = backend.errors.connect_error(refused)
    assert isinstance(problem, CannotConnect) and problem.cause == RetryCause.CONNECT


def test_the_pooler_stack_says_when_its_pgbouncer_exited() -> None:
    """What a failed check reports beside its error (`Server.gone`): nothing while PgBouncer runs; once it is gone,
    how it exited."""
    try:
        server = get("pgbouncer-transaction").provide()
    except Unavailable as exc:
        pytest.skip(f"pgbouncer-transaction unavailable: {exc}")
    try:
        assert server.gone() is None
        ini = next(p for p in Path(tempfile.gettempdir()).glob("idem-pgbouncer-*/pgbouncer.ini")
                   if f"listen_port = {server.url.port}\n" in p.read_text())
        os.kill(int((ini.parent / "pgbouncer.pid").read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while server.gone() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (server.gone() or "").startswith("pgbouncer exited with -9: ")
    finally:
        server.stop()
