"""`idem-dialects bench` on SQLite with tiny numbers: the JSON schema and the exactly-once check (no timings)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import idem_dialects_bench as benchmark
import pytest

from idem_dialects.cli import main


def run_bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    # Through the CLI's entry point, whose one handler prints the library's errors (a connection mistake included).
    code = main(["bench", *argv, "--quiet"])
    out, err = capsys.readouterr()
    return code, out, err


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'bench.db'}"


def test_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_bench(capsys, sqlite_url(tmp_path), "--workers", "3", "--requests", "12", "--repetitions",
                             "2", "--warmup", "3", "--duplicates", "0.5", "--memory-check", "40", "--format", "json")
    assert code == 0
    report: dict[str, Any] = json.loads(out)
    assert report["schema"] == "idem-dialects-bench/2"
    assert report["engine"]["backend"] == "sqlite"
    assert report["config"] == {"workers": 3, "requests": 12, "duplicates": 0.5, "repetitions": 2, "warmup": 3,
                                "memory_check": 40, "added_latency_ms": 0.0}
    assert report["wire"]["counted"] is False  # SQLite runs in the process: tests/test_bench_wire.py counts servers
    assert list(report["modes"]) == ["bare", "first", "replay", "contention"]  # no PL/pgSQL outside PostgreSQL
    for mode, m in report["modes"].items():
        assert m["requests"] == 24, mode
        assert len(m["throughput_per_s"]["per_repetition"]) == 2
        assert m["throughput_per_s"]["median"] > 0
        assert set(m["latency_ms"]) == {"p50", "p95", "p99", "max"}
        assert isinstance(m["retries"], dict)
        assert m["statements"]["count"] >= 2 and m["statements"]["commits"] == 1  # a SQLite replay: BEGIN, SELECT
        assert m["round_trips_per_request"] is None
    assert report["modes"]["bare"]["ratio_to_bare"] == 1.0
    assert report["modes"]["first"]["outcomes"] == {"applied": 24}
    assert report["modes"]["replay"]["outcomes"] == {"replayed": 24}
    # 12 requests at 50% duplicates: 6 distinct keys per slice, each sent twice.
    assert report["modes"]["contention"]["outcomes"] == {"applied": 12, "replayed": 12}
    once = report["exactly_once"]
    assert once["verified"] is True and once["effects"] == once["distinct_keys"] > 0
    # The one target list's entries for this run: at 3 workers none of the store's ratios, the memory check's growth.
    assert [t["target"] for t in report["targets"]] == ["memory growth per 10,000 requests"]
    assert set(report["targets"][0]) == {"target", "where", "value", "shown", "bound", "met"}
    check = report["memory"]["check"]
    assert check["requests"] == 40 and "growth_per_10k_kib" in check and isinstance(check["flat"], bool)
    assert report["memory"]["peak_rss_mib"] > 0


def test_table_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_bench(capsys, sqlite_url(tmp_path), "--requests", "5", "--repetitions", "1", "--warmup", "0")
    assert code == 0
    assert "exactly-once: verified" in out and "first-time via run" in out


def test_a_double_effect_fails_loudly(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that runs the effect again (what a broken backend would do) is caught in the database."""
    original = benchmark.Workload.via_run

    def double(self: benchmark.Workload, acct: int, key: str) -> str:
        outcome = original(self, acct, key)
        if outcome == "replayed":
            self.bare(acct, key)  # the effect runs a second time, outside the protocol
        return outcome

    monkeypatch.setattr(benchmark.Workload, "via_run", double)
    code, out, err = run_bench(capsys, sqlite_url(tmp_path), "--requests", "4", "--repetitions", "1",
                               "--warmup", "0", "--format", "json")
    assert code == 1
    assert out == ""
    assert "EXACTLY-ONCE VIOLATED" in err and "replay" in err


def test_tables_are_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sqlalchemy import create_engine, inspect

    url = sqlite_url(tmp_path)
    assert run_bench(capsys, url, "--requests", "2", "--repetitions", "1", "--warmup", "0")[0] == 0
    engine = create_engine(url)
    assert inspect(engine).get_table_names() == []
    engine.dispose()


@pytest.mark.parametrize("argv", [["--duplicates", "1.0"], ["--workers", "0"], ["--workers", "4", "--requests", "2"],
                                  ["--workers", "1,0"]])
def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run_bench(capsys, sqlite_url(tmp_path), *argv)
    assert code == 64 and "idem-dialects bench:" in err  # usage


@pytest.mark.parametrize(("levels", "why"), [("1,x", "numbers separated by commas"), ("2,2", "a level is repeated")])
def test_bad_levels(tmp_path: Path, capsys: pytest.CaptureFixture[str], levels: str, why: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["bench", sqlite_url(tmp_path), "--workers", levels])
    assert stopped.value.code == 64 and why in capsys.readouterr().err


def test_contention_plan_overlaps_keys() -> None:
    cfg = benchmark.Config(workers=4, requests=16, duplicates=0.5)
    s = benchmark.plan("contention", "0", cfg, {})
    assert s.size == 16 and s.expect_applied == 8
    # The two copies of each key go to different workers at the same position in their queues.
    first_round = [tasks[0][1] for tasks in s.per_worker]
    assert first_round == ["c0-0", "c0-0", "c0-1", "c0-1"]


def test_plpgsql_profile_outside_postgresql_is_a_usage_error(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before anything runs: no database file is even created."""
    url = sqlite_url(tmp_path)
    code, out, err = run_bench(capsys, url, "--profile", "plpgsql_first")
    assert code == 64 and out == ""  # usage
    assert "--profile plpgsql_first needs PostgreSQL" in err and url in err
    assert not (tmp_path / "bench.db").exists()
    code, _, err = run_bench(capsys, "--engine", "sqlite", "--engine", "mariadb", "--profile", "plpgsql_replay")
    assert code == 64 and "not on sqlite, mariadb" in err


def test_several_engines_in_one_run_print_one_side_by_side_table(capsys: pytest.CaptureFixture[str]) -> None:
    live = ["sqlite", "postgresql-18", "postgresql", "mariadb"]
    code, out, err = run_bench(capsys, *(a for n in live for a in ("--engine", n)), "--requests", "6",
                               "--repetitions", "1", "--warmup", "0", "--workers", "2")
    if code == 2 and "unavailable" in err.lower():
        pytest.skip(f"one of the four live engines is unavailable here: {err.strip()}")
    assert code == 0, err
    lines = out.splitlines()
    headers = [line.split() for line in lines if line.startswith(("requests/s", "latency p50"))]
    assert headers == [["requests/s", "(x", "bare)", *live], ["latency", "p50", "/", "p99", "ms", *live]]
    assert out.count("idem-dialects bench") == 1  # one report, not four
    for name in live:
        assert f"{name}: exactly-once verified" in out
    assert max(len(line) for line in lines) <= 120


def test_several_engines_json_is_a_set_of_single_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "bench.html"
    code, out, err = run_bench(capsys, "--engine", "sqlite", "--requests", "4", "--repetitions", "1", "--warmup",
                               "0", "--format", "json", "--output", str(tmp_path / "b.json"), "--html", str(html))
    assert code == 0 and out == "", err
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["schema"] == "idem-dialects-bench/2" and report["engine"]["name"] == "sqlite"
    assert report["machine"]["cpus"] and report["machine"]["python"]
    first = report["modes"]["first"]
    assert first["cpu_ms_per_request"] > 0
    assert first["statements"]["kinds"][0] == "BEGIN" and first["round_trips_per_request"] is None
    assert 'id="chart-throughput"' in html.read_text()


def test_several_levels_are_measured_in_turn_into_one_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_bench(capsys, sqlite_url(tmp_path), "--workers", "2,1", "--requests", "4", "--repetitions",
                               "1", "--warmup", "0", "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["schema"] == "idem-dialects-bench-set/1"
    assert [run["config"]["workers"] for run in report["runs"]] == [2, 1]
    assert all(run["exactly_once"]["verified"] for run in report["runs"])


def test_bare_effect_uses_the_stores_bounded_retry(tmp_path: Path) -> None:
    """Held write lock: the bare effect retries as `busy` within the store's budget, then raises RetriesExhausted."""
    import sqlite3

    from idem_dialects import IdempotencyStore, RetriesExhausted, RetryPolicy

    db = tmp_path / "bare.db"
    store = IdempotencyStore.from_url(f"sqlite:///{db}", table_prefix="bare_", retry=RetryPolicy(total=0.3),
                                      connect_args={"timeout": 0.01})
    work = benchmark.Workload(store)
    work.create([1], plpgsql=False)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(RetriesExhausted) as caught:
            work.bare(1, "")
        assert caught.value.causes["busy"] >= 2 and work.retries["busy"] >= 1
        holder.execute("ROLLBACK")
        assert work.bare(1, "") == "applied"
        assert work.debits([1]) == {1: 1}  # the failed attempts debited nothing
    finally:
        holder.close()
        work.drop()
        store.close()


@pytest.mark.parametrize("url", ["postgresql+psycopg://nobody@127.0.0.1:1/none", "nosuchdb://x"])
def test_unreachable_or_unknown_database_is_reported_without_traceback(capsys: pytest.CaptureFixture[str],
                                                                       url: str) -> None:
    code, out, err = run_bench(capsys, url)
    assert code == 2 and out == "" and "Traceback" not in err
    if "://x" in url:
        assert err.startswith(f"idem-dialects bench: {url}: ")
    else:  # a connection problem: the backend's classification, as every command prints it (docs/errors.md)
        assert err.startswith("idem-dialects bench: cannot connect to the postgresql database: ") and \
            "Connection refused" in err and err.splitlines()[1] == \
            "  fix: check that the server runs and listens at the URL's host and port", err


def test_a_named_engine_that_is_unavailable_stops_the_run_before_anything_is_measured(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IDEM_URL_ORACLE_23", raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/idem-dialects-test/docker.sock")
    code, out, err = run_bench(capsys, "--engine", "sqlite", "--engine", "oracle-23", "--requests", "2")
    assert code == 2 and out == ""
    assert "oracle-23 is unavailable" in err and "to provide it: set IDEM_URL_ORACLE_23=" in err
