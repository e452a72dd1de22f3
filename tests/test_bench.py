"""`idem-dialects bench` on SQLite with tiny numbers: the JSON schema and the exactly-once check (no timings)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from idem_dialects import benchmark
from idem_dialects.commands import bench


def run_bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    code = bench.run(parser.parse_args([*argv, "--quiet"]))
    out, err = capsys.readouterr()
    return code, out, err


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'bench.db'}"


def test_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_bench(capsys, sqlite_url(tmp_path), "--workers", "3", "--requests", "12", "--repetitions",
                             "2", "--warmup", "3", "--duplicates", "0.5", "--memory-check", "40", "--format", "json")
    assert code == 0
    report: dict[str, Any] = json.loads(out)
    assert report["schema"] == "idem-dialects-bench/1"
    assert report["engine"]["backend"] == "sqlite"
    assert report["config"] == {"workers": 3, "requests": 12, "duplicates": 0.5, "repetitions": 2, "warmup": 3,
                                "memory_check": 40}
    assert list(report["modes"]) == ["bare", "first", "replay", "contention"]  # no PL/pgSQL outside PostgreSQL
    for mode, m in report["modes"].items():
        assert m["requests"] == 24, mode
        assert len(m["throughput_per_s"]["per_repetition"]) == 2
        assert m["throughput_per_s"]["median"] > 0
        assert set(m["latency_ms"]) == {"p50", "p95", "p99", "max"}
        assert isinstance(m["retries"], dict)
        assert m["statements"]["count"] >= 2 and m["statements"]["commits"] == 1  # a SQLite replay: BEGIN, SELECT
    assert report["modes"]["bare"]["ratio_to_bare"] == 1.0
    assert report["modes"]["first"]["outcomes"] == {"applied": 24}
    assert report["modes"]["replay"]["outcomes"] == {"replayed": 24}
    # 12 requests at 50% duplicates: 6 distinct keys per slice, each sent twice.
    assert report["modes"]["contention"]["outcomes"] == {"applied": 12, "replayed": 12}
    once = report["exactly_once"]
    assert once["verified"] is True and once["effects"] == once["distinct_keys"] > 0
    assert [t["target"] for t in report["targets"]][:2] == [t[0] for t in benchmark.TARGETS[:2]]
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


@pytest.mark.parametrize("argv", [["--duplicates", "1.0"], ["--workers", "0"], ["--workers", "4", "--requests", "2"]])
def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run_bench(capsys, sqlite_url(tmp_path), *argv)
    assert code == 2 and "idem-dialects bench:" in err


def test_contention_plan_overlaps_keys() -> None:
    cfg = benchmark.Config(workers=4, requests=16, duplicates=0.5)
    s = benchmark.plan("contention", "0", cfg, {})
    assert s.size == 16 and s.expect_applied == 8
    # The two copies of each key go to different workers at the same position in their queues.
    first_round = [tasks[0][1] for tasks in s.per_worker]
    assert first_round == ["c0-0", "c0-0", "c0-1", "c0-1"]
