"""The engine catalogue: env var naming, families, and clear reasons when an engine cannot be provided."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from idem_dialects.cli import main
from idem_dialects.engines import ENGINES, EntryUnavailable, Unavailable, docker_reachable, env_var, expand, get

NO_DOCKER = "unix:///nonexistent/idem-dialects-test/docker.sock"
# Why no container can be had here: no Docker engine answers, or the [containers] extra is not installed.
WHY_NO_CONTAINER = ("Docker engine not reachable", "testcontainers is not installed")


@pytest.fixture
def no_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_DOCKER)
    for name in ENGINES:
        monkeypatch.delenv(env_var(name), raising=False)


def test_env_var_naming() -> None:
    assert env_var("postgresql-18") == "IDEM_URL_POSTGRESQL_18"
    assert env_var("mysql-8.4") == "IDEM_URL_MYSQL_8_4"
    assert env_var("mssql-2022") == "IDEM_URL_MSSQL_2022"


def test_catalogue_has_every_engine() -> None:
    assert set(ENGINES) == {"sqlite", "postgresql-18", "postgresql", "mariadb", "mysql-8.4", "mssql-2022",
                            "mssql-2025", "oracle-23", "oracle-26", "postgresql-patroni", "pgbouncer-transaction",
                            "galera-haproxy-all-writers", "galera-haproxy-single-writer"}


def test_families_expand() -> None:
    assert expand(["mssql"]) == ["mssql-2022", "mssql-2025"]
    assert expand(["oracle", "mysql"]) == ["oracle-23", "oracle-26", "mysql-8.4"]
    assert expand(["postgresql"]) == ["postgresql"]  # an exact name wins over the family
    assert expand(["galera-haproxy"]) == ["galera-haproxy-all-writers", "galera-haproxy-single-writer"]
    assert expand(["sqlite", "sqlite"]) == ["sqlite"]
    assert expand(["all"]) == list(ENGINES)
    with pytest.raises(KeyError, match="unknown engine 'db2'"):
        expand(["db2"])


def test_no_docker_is_a_clear_reason(no_docker: None) -> None:
    pytest.importorskip("testcontainers", reason="the [containers] extra is not installed: nothing asks Docker")
    with pytest.raises(Unavailable, match="Docker engine not reachable"):
        docker_reachable()


def test_no_testcontainers_is_a_clear_reason(no_docker: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "testcontainers", None)  # as without the [containers] extra
    with pytest.raises(Unavailable, match=r"testcontainers is not installed \(pip install 'idem-dialects\[con"):
        docker_reachable()


def test_passes_without_the_containers_extra() -> None:
    """This module, run where testcontainers and docker cannot be imported: every test passes or skips with why."""
    code = ("import sys, pytest\n"
            "sys.modules['testcontainers'] = sys.modules['docker'] = None\n"
            f"sys.exit(pytest.main([{__file__!r}, '-q', '-p', 'no:cacheprovider', '-k', 'not without_the_containers',"
            " '-rs']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed" not in done.stdout and "the [containers] extra is not installed" in done.stdout


@pytest.mark.parametrize("name", ["mysql-8.4", "mssql-2022", "mssql-2025", "oracle-23", "oracle-26"])
def test_container_engines_say_how_to_enable(no_docker: None, name: str) -> None:
    with pytest.raises(EntryUnavailable) as err:
        get(name).provide()
    exc = err.value
    assert f"{env_var(name)} is not set" in exc.reasons[0]
    assert any(why in exc.reasons[-1] for why in WHY_NO_CONTAINER), exc.reasons[-1]
    assert env_var(name) in exc.hint and "://" in exc.hint and "Docker" in exc.hint


def test_url_from_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEM_URL_MSSQL_2022", "mssql+pyodbc://sa:pw@db:1433/master?driver=FreeTDS")
    server = get("mssql-2022").provide()
    assert server.url.get_backend_name() == "mssql" and server.how == "URL from IDEM_URL_MSSQL_2022"


def test_engines_probe_command(no_docker: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engines", "--probe", "--engine", "sqlite", "--engine", "mssql-2022", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    found = report["engines"]
    assert report["probed"] is True
    assert found["sqlite"]["available"] and found["sqlite"]["how"].startswith("embedded")
    assert not found["mssql-2022"]["available"]
    assert "IDEM_URL_MSSQL_2022" in found["mssql-2022"]["hint"]
    assert main(["engines", "--probe", "--engine", "oracle"]) == 0
    out = capsys.readouterr().out
    assert "oracle-23" in out and "oracle-26" in out and "to enable" in out


def test_engines_lists_the_catalogue_without_providing_anything(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """No provider runs (so no server, cluster or container starts), no process is spawned, nothing is connected to:
    every way of doing so fails the test. A URL in the environment is named, not reached."""
    import socket
    import subprocess

    from idem_dialects.engines import CatalogueEntry

    ran: list[str] = []

    def forbidden(what: str) -> Any:
        def trip(*args: Any, **kwargs: Any) -> Any:
            ran.append(what)
            raise AssertionError(f"`idem-dialects engines` {what}")

        return trip

    monkeypatch.setattr(CatalogueEntry, "provide", forbidden("ran a provider"))
    monkeypatch.setattr(subprocess.Popen, "__init__", forbidden("started a process"))
    monkeypatch.setattr(socket.socket, "connect", forbidden("connected to a server"))
    monkeypatch.setenv("IDEM_URL_MSSQL_2022", "mssql+pyodbc://sa:secret@db.invalid:1433/master?driver=FreeTDS")
    assert main(["engines", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert ran == [] and report["probed"] is False
    assert list(report["engines"]) == list(ENGINES)
    assert report["engines"]["mssql-2022"]["url_from_env"] is True
    assert report["engines"]["mssql-2022"]["providers"][0] == "the URL in IDEM_URL_MSSQL_2022"
    assert "secret" not in json.dumps(report)
    assert report["engines"]["galera-haproxy-single-writer"]["providers"] == [
        "HAProxy (one writer, two backups) in front of a 3-node Galera cluster, started on loopback ports from the"
        " machine's haproxy, galera-4 and mariadb-server packages"]
    assert main(["engines"]) == 0
    out = capsys.readouterr().out
    assert "postgresql-patroni" in out and "engines --probe" in out and ran == []


def test_servers_the_project_starts_keep_out_of_the_machines_tmpdir() -> None:
    """A starting mariadbd deletes every `#sql*` file in its tmpdir as its own leftovers. A private MariaDB (or a
    Galera node) started with /tmp, the machine MariaDB's tmpdir too, deleted that server's temporary tables under a
    test on another xdist worker ("Error on delete of '/tmp/#sql-temptable-...'"). A temporary table of the machine's
    MariaDB outlives a private server's start."""
    pymysql = pytest.importorskip("pymysql", reason="PyMySQL is not installed (pip install 'idem-dialects[mysql]')")
    from idem_dialects.engines import provisioning

    try:
        machine = pymysql.connect(host="127.0.0.1", port=3306, user="root", database="test")
    except pymysql.err.OperationalError as exc:
        pytest.skip(f"MariaDB does not answer on 127.0.0.1:3306 here: {exc}")
    try:
        with machine.cursor() as cursor:
            cursor.execute("CREATE TEMPORARY TABLE idem_outlives_a_start (a INT) ENGINE=Aria")  # files in its tmpdir
            try:
                server = provisioning("mariadb").private_server("mariadb")
            except Unavailable as exc:
                pytest.skip(f"no private MariaDB server: {exc}")
            server.stop()
            cursor.execute("INSERT INTO idem_outlives_a_start VALUES (1)")
            cursor.execute("DROP TEMPORARY TABLE idem_outlives_a_start")
    finally:
        machine.close()
