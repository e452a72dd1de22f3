"""Monitoring that is right or says it is not: right after a bulk of rows passed retention with no ANALYZE (the
engine's statistics present but stale, the dangerous case), `stats --fail-on-backlog` fails on PostgreSQL and
MariaDB with the backlog counted or marked stale; with fresh statistics it still answers from them; `purge` reports
the rows a rotation dropped, counted; SQLite (the portable default) keeps no statistics, so nothing is stale."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from argparse import Namespace
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Table

from idem_dialects import IdempotencyStore
from idem_dialects import retention as retention_module
from idem_dialects.cli.commands import EXIT_FAILED
from idem_dialects.cli.commands.stats import backlog_bound, describe, exceeded
from idem_dialects.dialects.maintenance import Maintenance
from idem_dialects.engines import Server
from idem_dialects.retention import Stats

N = 200_000
THRESHOLD = 100_000


def make_store(db_server: Server, generations: bool = False) -> Iterator[IdempotencyStore]:
    made = IdempotencyStore.from_url(db_server.url, table_prefix=f"z{secrets.token_hex(3)}_")
    made.create_tables(generations=generations)
    try:
        yield made
    finally:
        made.drop_tables()
        made.close()


@pytest.fixture
def store(db_server: Server) -> Iterator[IdempotencyStore]:
    yield from make_store(db_server)


@pytest.fixture
def generational(db_server: Server) -> Iterator[IdempotencyStore]:
    yield from make_store(db_server, generations=True)


def analyze(store: IdempotencyStore, *tables: Table) -> None:
    postgres = store.backend.name == "postgresql"
    with store.engine.begin() as conn:
        for table in tables:
            conn.exec_driver_sql(f"{'ANALYZE' if postgres else 'ANALYZE TABLE'} {table.name}")


def load(store: IdempotencyStore, table: Table, n: int = N) -> None:
    """`n` rows completed (or processed) two days ago, in one statement: past a retention of a day."""
    if store.backend.name == "postgresql":
        numbers, key, old = f"generate_series(1, {n}) AS g(seq)", "'k' || seq", "now() - interval '2 days'"
    else:
        numbers, key, old = f"seq_1_to_{n}", "concat('k', seq)", "utc_timestamp(6) - interval 2 day"
    if table is store.tables.messages:
        sql = (f"INSERT INTO {table.name} (subscriber, message_id, fingerprint, processed_at)"
               f" SELECT 'sub', {key}, NULL, {old} FROM {numbers}")
    else:
        sql = (f"INSERT INTO {table.name} (scope, operation, idem_key, fingerprint, claim_token, created_at,"
               f" locked_until, completed_at, status, response) SELECT 's', 'op', {key}, 'f', 't', {old}, {old},"
               f" {old}, 200, NULL FROM {numbers}")
    with store.engine.begin() as conn:
        conn.exec_driver_sql(sql)
    store.engine.dispose()  # the sessions end: PostgreSQL's cumulative statistics have the writes at once
    deadline = time.monotonic() + 30
    while True:  # the engine's running row count, what makes `stats` answer from estimates
        with store.engine.connect() as conn:
            if (store.backend.maintenance.rows(conn, table) or 0) >= n * 0.9 or time.monotonic() > deadline:
                return
        time.sleep(0.2)


def cli(command: str, store: IdempotencyStore, *args: str) -> subprocess.CompletedProcess[str]:
    url = store.engine.url.render_as_string(hide_password=False)
    return subprocess.run([sys.executable, "-m", "idem_dialects.cli", command, url, "--table-prefix",
                           store.table_prefix, *args], capture_output=True, text=True, timeout=300)


def test_fail_on_backlog_right_after_a_bulk_load_with_no_analyze(store: IdempotencyStore) -> None:
    analyze(store, store.tables.records, store.tables.messages)  # statistics of the empty table: present, stale
    load(store, store.tables.records)
    done = cli("stats", store, "--fail-on-backlog", str(THRESHOLD), "--format", "json")
    report = json.loads(done.stdout)
    assert "records" in report["estimated"], report  # the large-table path, not an exact count of everything
    purgeable = report["records"]["purgeable"]
    assert abs(purgeable - N) <= N // 10 or "purgeable" in report["stale"], report
    assert done.returncode == EXIT_FAILED, (done.stdout, done.stderr)
    assert "exceed --fail-on-backlog 100000" in done.stderr or "stale" in done.stderr, done.stderr


def test_messages_past_retention_with_no_analyze_fail_the_check(store: IdempotencyStore) -> None:
    """The messages' backlog has no index to be counted on: an estimate from stale statistics is marked stale, and
    the check fails unless even the whole table is within the threshold."""
    analyze(store, store.tables.records, store.tables.messages)
    load(store, store.tables.messages)
    done = cli("stats", store, "--fail-on-backlog", str(THRESHOLD), "--format", "json")
    report = json.loads(done.stdout)
    assert "messages" in report["estimated"], report
    purgeable = report["messages"]["purgeable"]
    assert abs(purgeable - N) <= N // 10 or "purgeable_messages" in report["stale"], report
    assert done.returncode == EXIT_FAILED, (done.stdout, done.stderr)
    table = cli("stats", store)
    assert table.returncode == 0
    if "purgeable_messages" in report["stale"]:
        assert "(stale)" in table.stdout and "ANALYZE" in table.stdout, table.stdout
        assert "stale statistics" in done.stderr and "ANALYZE" in done.stderr, done.stderr
    assert "stale" not in cli("stats", store, "--fail-on-backlog", str(2 * N)).stderr  # the bound is the table


def test_fresh_statistics_are_still_used(store: IdempotencyStore) -> None:
    load(store, store.tables.records)
    analyze(store, store.tables.records, store.tables.messages)
    seen = store.stats()
    assert seen.stale == () and {"records", "completed"} <= set(seen.estimated), seen
    if type(store.backend.maintenance).older_than is not Maintenance.older_than:  # the planner's estimate of a range
        assert "purgeable" in seen.estimated, seen
    assert abs(seen.purgeable - N) <= N // 10, seen
    with store.engine.connect() as conn:
        assert not store.backend.maintenance.stale(conn, store.tables.records)


def test_purge_reports_the_rows_a_rotation_dropped_counted(generational: IdempotencyStore) -> None:
    store = generational
    load(store, store.tables.previous)  # a generation all past retention
    # The engine's row count is now ANALYZE's estimate from its sample (InnoDB: 159,861 for 200,000 once).
    analyze(store, store.tables.previous)
    store.run(scope="s", operation="op", key="recent", request={}, effect=lambda conn: 1)
    stats = store.stats()
    assert stats.purgeable == N or "purgeable" in stats.estimated, stats
    done = cli("purge", store, "--older-than", "1d")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"purged {N} rows"), done.stdout  # counted, never the engine's estimate
    assert store.run(scope="s", operation="op", key="recent", request={}, effect=lambda conn: 2).replayed


def test_the_portable_default_reports_nothing_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 's.db'}", retention=timedelta(0)) as store:
        store.create_tables()
        store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1)
        time.sleep(0.01)
        with store.engine.connect() as conn:
            assert store.backend.maintenance.stale(conn, store.tables.records) is False
            assert store.backend.maintenance.count_older_than(conn, store.tables.records, "completed_at", 0) == 1
        monkeypatch.setattr(retention_module, "EXACT_BELOW", 0)  # SQLite keeps no estimates: counted anyway
        seen = store.stats()
    assert (seen.estimated, seen.stale, seen.purgeable) == ((), (), 1)
    assert seen.as_dict()["stale"] == []


def _stats(**figures: object) -> Stats:
    base: dict[str, object] = dict(retention=timedelta(days=1), db_now=datetime(2026, 1, 1, tzinfo=UTC),
                                   completed=N, in_flight=0, expired=0, purgeable=N, oldest_open=None,
                                   messages=N, purgeable_messages=5_000,
                                   estimated=("records", "completed", "messages", "purgeable_messages"),
                                   stale=("purgeable_messages",))
    return Stats(**(base | figures))  # type: ignore[arg-type]


def test_a_stale_backlog_fails_the_check_and_says_how_to_get_a_right_figure() -> None:
    stale = _stats(purgeable=0)
    assert backlog_bound(stale) == N
    problems = exceeded(stale, Namespace(fail_on_stuck=None, fail_on_backlog=THRESHOLD, fail_on_age=None))
    assert len(problems) == 1 and "stale statistics" in problems[0] and "ANALYZE" in problems[0], problems
    assert exceeded(stale, Namespace(fail_on_stuck=None, fail_on_backlog=N, fail_on_age=None)) == []
    text = describe(stale, "db")
    assert "~5,000 (stale) messages" in text and "ANALYZE" in text, text
    assert stale.as_dict()["stale"] == ["purgeable_messages"]


def test_a_sharded_stats_carries_every_shards_stale_figures() -> None:
    both = Stats.combined({"a": _stats(), "b": _stats(stale=())})
    assert both.stale == ("purgeable_messages",) and both.shards["b"].stale == ()
    assert Stats.combined({"a": _stats(stale=()), "b": _stats(stale=())}).stale == ()
