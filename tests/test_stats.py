"""Retention an operator can see: the store's `retention` drives `purge` and `stats`; `idem-dialects stats` on every
live engine shows a stuck claim and an unpurged backlog the test made, and exits with the monitoring status when asked;
SQL Server's and Oracle's size statements compiled by SQLAlchemy's own dialects."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from async_common import async_store_class
from sqlalchemy import func, select

from idem_dialects import IdempotencyStore, InvalidPayload
from idem_dialects.cli.commands import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from idem_dialects.schema import build_tables
from idem_dialects.url import offline


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "idem_dialects.cli", "stats", *args], capture_output=True,
                          text=True, timeout=300)


def _fill(store: IdempotencyStore) -> None:
    """3 completed records, 1 stuck claim (lease over, never completed), 1 live claim, 1 processed message."""
    for n in range(3):
        store.run(scope="s", operation="op", key=f"done{n}", request={}, effect=lambda conn: {"n": 1})
    with store.transaction() as conn:
        store.claim(conn, scope="s", operation="op", key="stuck", request={}, lease=timedelta(milliseconds=1))
        store.accept_message(conn, subscriber="projection", message_id="m1")


def test_stats_on_every_live_engine_shows_stuck_claims_and_backlog(live_engine: Any) -> None:
    prefix = f"st{uuid.uuid4().hex[:6]}_"
    url = live_engine.url.render_as_string(hide_password=False)
    store = IdempotencyStore.from_url(live_engine.url, table_prefix=prefix, retention=timedelta(seconds=1))
    try:
        store.create_tables()
        _fill(store)
        time.sleep(1.5)  # the stuck claim's lease is over; all of it is past a retention of 1s
        with store.transaction() as conn:
            store.claim(conn, scope="s", operation="op", key="live", request={}, lease=timedelta(hours=1))

        seen = store.stats()
        assert (seen.completed, seen.in_flight, seen.expired, seen.records) == (3, 1, 1, 5)
        # The backlog is what purge would delete: the completed records and the stuck claim, never the live one.
        assert (seen.purgeable, seen.messages, seen.purgeable_messages) == (4, 1, 1)
        assert seen.oldest_open_age is not None and timedelta(seconds=1) < seen.oldest_open_age < timedelta(minutes=5)
        sizes = [seen.sizes[t.name] for t in (store.tables.records, store.tables.messages)]
        assert all(size is not None and size.table_bytes > 0 for size in sizes), (sizes, seen.sizes_unavailable)

        quiet = cli(url, "--table-prefix", prefix, "--retention", "1s", "--format", "json")
        assert quiet.returncode == EXIT_OK, quiet.stderr
        report = json.loads(quiet.stdout)
        assert report["records"] == {"total": 5, "completed": 3, "in_flight": 1, "expired": 1, "purgeable": 4}
        assert report["messages"] == {"total": 1, "purgeable": 1}
        assert report["oldest_open"]["age_seconds"] > 1
        assert set(report["sizes"]) == {f"{prefix}records", f"{prefix}messages"}
        assert not live_engine.url.password or live_engine.url.password not in quiet.stdout

        alarmed = cli(url, "--table-prefix", prefix, "--retention", "1s", "--fail-on-stuck", "0",
                      "--fail-on-backlog", "4", "--fail-on-age", "1s")
        assert alarmed.returncode == EXIT_FAILED, alarmed.stderr
        assert re.search(r"^  expired lease +1  \(stuck", alarmed.stdout, re.M), alarmed.stdout
        assert "4 records, 1 messages" in alarmed.stdout
        problems = alarmed.stderr.strip().splitlines()
        assert len(problems) == 3 and "Traceback" not in alarmed.stderr
        assert "1 stuck claims" in problems[0] and "5 rows past retention" in problems[1]
        assert "oldest open claim" in problems[2]

        within = cli(url, "--table-prefix", prefix, "--retention", "1s", "--fail-on-stuck", "1",
                     "--fail-on-backlog", "5")
        assert within.returncode == EXIT_OK and within.stderr == "", within.stderr
        # The default retention (a day): nothing is past it yet.
        assert '"purgeable": 0' in cli(url, "--table-prefix", prefix, "--format", "json").stdout

        assert store.purge() == 4 + 1  # purge with no window uses the store's retention
        after = store.stats()
        assert (after.records, after.purgeable, after.in_flight, after.messages) == (1, 0, 1, 0)
    finally:
        store.drop_tables()
        store.close()


@pytest.mark.parametrize(("args", "status", "expected"), [
    (["postgresql+psycopg://postgres@127.0.0.1:1/test"], EXIT_UNAVAILABLE, ["Connection refused", "host and port"]),
    (["sqlite:////nonexistent-dir/x.db"], EXIT_UNAVAILABLE, ["directory exists"]),
    (["sqlite://", "--fail-on-stuck", "-1"], EXIT_USAGE, ["whole number"]),
    (["sqlite://", "--retention", "soon"], EXIT_USAGE, ["not a duration"]),
    (["nosuch://x"], EXIT_CONFIG, ["nosuch"]),
])
def test_stats_errors_are_short(args: list[str], status: int, expected: list[str]) -> None:
    done = cli(*args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr and (1 <= len(lines) <= 2 or status == EXIT_USAGE), done.stderr
    for text in expected:
        assert text in done.stderr, done.stderr


def test_stats_on_missing_tables_says_how_to_create_them(tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "empty.db").close()  # a database without the store's tables
    done = cli(f"sqlite:///{tmp_path / 'empty.db'}")
    assert done.returncode == EXIT_CONFIG and "idem-dialects init URL" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2


def test_retention_is_a_store_setting_used_by_purge(tmp_path: Path) -> None:
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'r.db'}") as store:
        assert store.retention == timedelta(hours=24)
        store.create_tables()
        store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1)
        time.sleep(0.01)
        assert store.purge() == 0  # a day has not passed
        store.retention = timedelta(0)
        assert store.stats().purgeable == 1
        assert store.purge() == 1
        with pytest.raises(InvalidPayload, match="retention"):
            store.retention = timedelta(days=-1)
        with pytest.raises(InvalidPayload, match="retention"):
            IdempotencyStore.from_url("sqlite://", retention=3600)  # type: ignore[arg-type]
        with pytest.raises(InvalidPayload, match="older_than"):
            store.purge(older_than=timedelta(days=-1))


def test_async_store_has_the_same_retention_and_stats(tmp_path: Path) -> None:
    async def main() -> None:
        url = f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"
        async with async_store_class().from_url(url, retention=timedelta(0)) as store:
            await store.create_tables()

            async def effect(conn: Any) -> int:
                return 1

            await store.run(scope="s", operation="op", key="k", request={}, effect=effect)
            await asyncio.sleep(0.01)
            seen = await store.stats()
            assert (seen.completed, seen.purgeable, seen.retention) == (1, 1, timedelta(0))
            assert await store.purge() == 1
            assert (await store.stats()).records == 0

    asyncio.run(main())


def _compiled(url: str) -> tuple[str, dict[str, Any]]:
    backend = offline(url)
    tables = build_tables("idem_", backend)
    statement = backend.maintenance.size_statement(tables.records)
    assert statement is not None
    compiled = statement.compile(dialect=backend.engine.dialect)
    return str(compiled), dict(compiled.params)


def test_sql_server_size_statement_compiles() -> None:
    sql, params = _compiled("mssql+pyodbc://sa@db/app?driver=FreeTDS")
    assert "FROM sys.dm_db_partition_stats" in sql
    assert "WHERE sys.dm_db_partition_stats.object_id = object_id(:param_1)" in sql
    assert "CASE WHEN (sys.dm_db_partition_stats.index_id < 2)" in sql and "* 8192" in sql
    assert list(params.values()) == ["idem_records"]


def test_oracle_size_statement_compiles() -> None:
    sql, params = _compiled("oracle+oracledb://system@db/?service_name=FREEPDB1")
    assert sql.endswith("FROM DUAL")
    assert "FROM user_segments" in sql and "FROM user_lobs" in sql and "FROM user_indexes" in sql
    assert "user_lobs.table_name = :param_1" in sql
    assert set(params.values()) >= {"IDEM_RECORDS"}  # the data dictionary's spelling of the unquoted name


def test_every_backend_reports_sizes_or_says_it_does_not() -> None:
    for url in ("sqlite", "postgresql", "mysql", "mariadb"):
        backend = offline(url)
        assert backend.maintenance.size_statement(build_tables("idem_", backend).records) is not None, url


def test_purge_counts_what_stats_called_the_backlog(tmp_path: Path) -> None:
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'b.db'}", retention=timedelta(0)) as store:
        store.create_tables()
        _fill(store)
        time.sleep(0.05)
        backlog = store.stats()
        deleted = store.purge()
        with store.engine.connect() as conn:
            left = conn.execute(select(func.count()).select_from(store.tables.records)).scalar_one()
    assert deleted == backlog.purgeable + backlog.purgeable_messages == 5 and left == 0
