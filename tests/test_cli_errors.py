"""The CLI as a user meets it: every expected error is at most two lines on stderr (what failed, how to fix it)
with its documented exit status (2 a database did not answer, 64 usage, 78 configuration), never a traceback;
`ddl` prints every backend's DDL offline; `init` and `purge` work on every live engine."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, inspect, select

from idem_dialects import IdempotencyStore
from idem_dialects.cli.commands import EXIT_CONFIG, EXIT_UNAVAILABLE, EXIT_USAGE

engines: Any = import_module("idem_dialects.engines")
LIVE = ["sqlite", "postgresql-18", "postgresql", "mariadb"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "idem_dialects.cli", *args], capture_output=True, text=True,
                          timeout=300)


def assert_short_error(done: subprocess.CompletedProcess[str], status: int, *expected: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == status, done.stderr
    assert 1 <= len(lines) <= 2 and "Traceback" not in done.stderr, done.stderr
    for text in expected:
        assert text in done.stderr, done.stderr


def provide(name: str) -> Any:
    spec = engines.get(name)
    try:
        return spec.provide()
    except engines.Unavailable as exc:
        pytest.skip(f"{spec.name}: {exc}")


@pytest.fixture(scope="module", params=LIVE)
def server(request: pytest.FixtureRequest) -> Iterator[Any]:
    provided = provide(request.param)
    yield provided
    provided.stop()


@pytest.mark.parametrize(("args", "status", "expected"), [
    (["check", "postgres://postgres@127.0.0.1:5432/test"], EXIT_CONFIG, ["did you mean postgresql://?"]),
    (["check", "mysql+mysqldb://root@127.0.0.1:3306/test"], EXIT_CONFIG, ["pip install 'mysqlclient'"]),
    (["check", "postgresql+psycopg://postgres@127.0.0.1:1/test"], EXIT_UNAVAILABLE,
     ["Connection refused", "host and port"]),
    (["init", "mariadb+pymysql://root@127.0.0.1:1/test"], EXIT_UNAVAILABLE, ["Connection refused", "host and port"]),
    (["demo", "--url", "postgresql+psycopg://postgres@127.0.0.1:1/test"], EXIT_UNAVAILABLE, ["Connection refused"]),
    (["bench", "postgresql+psycopg://postgres@127.0.0.1:1/test", "--requests", "5", "--repetitions", "1"],
     EXIT_UNAVAILABLE, ["Connection refused"]),
    (["purge", "sqlite:////nonexistent-dir/x.db", "--older-than", "24h"], EXIT_UNAVAILABLE, ["directory exists"]),
    (["ddl", "nosuch://"], EXIT_CONFIG, ["known backends"]),
    (["purge", "sqlite://", "--older-than", "1d", "--batch-size", str(2**63)], EXIT_USAGE,
     ["batch_size", "1,000,000"]),
    (["check", "not a url"], EXIT_USAGE, ["not a database URL"]),
])
def test_expected_errors_are_two_lines_with_their_status(args: list[str], status: int, expected: list[str]) -> None:
    assert_short_error(cli(*args), status, *expected)


def test_wrong_password() -> None:
    server = provide("mariadb")  # PostgreSQL here trusts every local login; MariaDB checks passwords
    try:
        url = server.url.set(password="certainly-wrong")
        done = cli("check", url.render_as_string(hide_password=False), "--quiet")
        assert_short_error(done, EXIT_UNAVAILABLE, "1045", "check the user and password")
        assert "certainly-wrong" not in done.stderr + done.stdout
    finally:
        server.stop()


def test_missing_database() -> None:
    server = provide("postgresql-18")
    try:
        url = server.url.set(database="idem_no_such_db")
        assert_short_error(cli("check", url.render_as_string(hide_password=False), "--quiet"), EXIT_UNAVAILABLE,
                           "the database 'idem_no_such_db' does not exist")
        assert_short_error(cli("init", url.render_as_string(hide_password=False)), EXIT_UNAVAILABLE, "idem_no_such_db")
    finally:
        server.stop()


def test_missing_tables_in_purge(tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "empty.db").close()  # a database without the store's tables
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert_short_error(cli("purge", url, "--older-than", "1d"), EXIT_CONFIG, "idem-dialects init URL")


def test_output_is_checked_before_any_work(tmp_path: Path) -> None:
    done = cli("check", f"sqlite:///{tmp_path / 'x.db'}", "--output", str(tmp_path / "missing" / "report.json"))
    assert_short_error(done, EXIT_USAGE, "cannot write the report", "does not exist")
    assert not (tmp_path / "x.db").exists()  # nothing was provisioned or run


@pytest.mark.parametrize(("backend", "key_type"), [
    ("sqlite", "scope VARCHAR(255) NOT NULL"),
    ("postgresql", 'scope VARCHAR(255) COLLATE "C" NOT NULL'),
    ("mysql", "scope VARBINARY(1020) NOT NULL"),
    ("mariadb", "scope VARBINARY(1020) NOT NULL"),
    ("mssql+pyodbc://sa@db/app?driver=FreeTDS", "scope VARBINARY(1020) NOT NULL"),
    ("oracle+oracledb://system@db/?service_name=FREEPDB1", "scope RAW(1020) NOT NULL"),
])
def test_ddl_prints_create_statements_offline(backend: str, key_type: str) -> None:
    done = cli("ddl", backend, "--table-prefix", "svc_")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("CREATE TABLE") == 3  # records, processed messages, the outbox
    assert all(f"CREATE TABLE svc_{table} (" in done.stdout for table in ("records", "messages", "outbox"))
    assert "CREATE INDEX svc_records_done_ix" in done.stdout and key_type in done.stdout
    if backend.startswith("mssql"):
        assert "PRIMARY KEY NONCLUSTERED (scope, operation, idem_key)" in done.stdout


def test_init_and_purge_on_every_live_engine(server: Any) -> None:
    prefix = f"cli_{uuid.uuid4().hex[:6]}_"
    url = server.url.render_as_string(hide_password=False)
    done = cli("init", url, "--table-prefix", prefix)
    assert done.returncode == 0, done.stderr
    assert "***" in done.stdout or server.url.password is None  # the password is never printed
    store = IdempotencyStore.from_url(server.url, table_prefix=prefix)
    try:
        assert {f"{prefix}records", f"{prefix}messages"} <= set(inspect(store.engine).get_table_names())
        for i in range(3):
            store.run(scope="s", operation="op", key=f"k{i}", request={}, effect=lambda conn: 1)
        gone = cli("purge", url, "--table-prefix", prefix, "--older-than", "0s", "--batch-size", "2", "-v")
        assert gone.returncode == 0, gone.stderr
        # Records committed before the purge began are older than 0s; the summary counts exactly those deleted.
        with store.engine.connect() as conn:
            left = conn.execute(select(func.count()).select_from(store.tables.records)).scalar_one()
        assert f"{prefix}records: " in gone.stderr and f"purged {3 - left} rows" in gone.stdout
    finally:
        store.drop_tables()
        store.engine.dispose()
