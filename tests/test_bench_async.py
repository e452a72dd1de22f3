"""`idem-dialects bench --api async` on SQLite with tiny numbers: the report's shape and exactly-once (no timings)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from idem_dialects_bench import command as bench
from sqlalchemy import create_engine, inspect


def test_async_bench_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args([url, "--api", "async", "--concurrency", "2", "--requests", "4", "--sleep", "0.01",
                              "--format", "json", "--quiet"])
    assert bench.run(args) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert report["schema"] == "idem-dialects-bench-async/2"
    assert report["wire"]["counted"] is False  # SQLite runs in the process: tests/test_bench_wire.py counts servers
    assert (report["engine"]["driver"], report["engine"]["sync_driver"]) == ("aiosqlite", "pysqlite")
    assert list(report["modes"]) == ["bare", "first", "replay", "contention", "sync_first", "sync_replay",
                                     "sleep_async", "sleep_sync_in_loop", "sleep_sync_to_thread"]
    modes = report["modes"]
    assert modes["first"]["replayed"] == 0 and modes["replay"]["replayed"] == modes["replay"]["requests"] == 4
    assert modes["contention"]["replayed"] == 2  # both tasks send each key at the same moment: one replays
    assert all(m["heartbeat_worst_lag_ms"] >= 0 for m in modes.values())
    assert set(report["sleep_figure"]) == {"sleep_async", "sleep_sync_in_loop", "sleep_sync_to_thread"}
    assert report["exactly_once"]["distinct_keys"] == 4 + 2 + 4 + 3 * 2  # first, contention, sync, three sleeps
    assert "event-loop lag beside them (a 10 ms heartbeat's worst delay)" in [t["target"] for t in report["targets"]]
    assert inspect(create_engine(url)).get_table_names() == []  # the bench dropped its tables


def test_async_bench_refuses_a_backend_without_async_driver(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from idem_dialects import dialects

    monkeypatch.setattr(dialects, "usable_drivers", lambda backend, asynchronous=False: ())
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert bench.run(parser.parse_args(["sqlite:///x.db", "--api", "async", "--quiet"])) == 2
    assert "no async driver for sqlite" in capsys.readouterr().err


def test_async_bench_repetitions_pair_each_mode_with_the_bare_effect(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """--repetitions runs every throughput mode that many times in turn, with keys new to each repetition: medians,
    per-repetition rates and the paired ratio to the bare effect are in the report (no timings asserted)."""
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args([url, "--api", "async", "--concurrency", "2", "--requests", "4", "--repetitions", "3",
                              "--sleep", "0.01", "--format", "json", "--quiet"])
    assert bench.run(args) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert report["config"]["repetitions"] == 3
    modes = report["modes"]
    for name in ("bare", "first", "replay", "contention", "sync_first", "sync_replay"):
        assert modes[name]["requests"] == 12 and len(modes[name]["throughput_per_repetition"]) == 3
        assert modes[name]["ratio_to_bare_paired"] > 0
    assert modes["replay"]["replayed"] == 12 and modes["first"]["replayed"] == 0
    assert "ratio_to_bare_paired" not in modes["sleep_async"]  # the sleep figure runs once
    assert report["exactly_once"]["distinct_keys"] == 3 * (4 + 2 + 4) + 3 * 2
