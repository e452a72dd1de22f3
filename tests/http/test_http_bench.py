"""`idem-dialects bench --api http` runs end to end (a real uvicorn server, keep-alive connections) and its
exactly-once check passes; no timings."""

from __future__ import annotations

import gc
import json

import pytest

pytest.importorskip("uvicorn", reason="uvicorn (the [dev] extra) is not installed")
pytest.importorskip("aiosqlite", reason="the [aiosqlite] extra is not installed")

from idem_dialects.cli import main


def test_http_bench_on_sqlite_checks_exactly_once(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--api", "http", "--engine", "sqlite", "--requests", "40", "--concurrency", "4", "--quiet"]
    assert main([*argv, "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| sqlite |")]
    assert [row.split("|")[2:4] for row in rows] == [
        [" throughput ", " bare "], [" throughput ", " middleware first-time "],
        [" throughput ", " middleware replay "],
        [" latency ", " bare "], [" latency ", " middleware (external call) "]]
    assert "exactly-once: balance and record count checked" in out
    assert ("server CPU per first-time request \N{MULTIPLICATION SIGN} the bare endpoint's (HTTP, sqlite 3.40.1,"
            " 4 connections)") in out


@pytest.mark.parametrize("framework", ["starlette", "fastapi"])
def test_http_bench_json_report(capsys: pytest.CaptureFixture[str], framework: str) -> None:
    if framework == "fastapi":
        pytest.importorskip("fastapi", reason="the [fastapi] extra is not installed")
    assert main(["bench", "sqlite", "--api", "http", "--requests", "8", "--concurrency", "2", "--repetitions", "2",
                 "--framework", framework, "--quiet", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "idem-dialects-bench-http/4"
    assert report["config"]["framework"] == framework and report["config"]["repetitions"] == 2
    assert (report["engine"]["name"], report["engine"]["driver"]) == ("sqlite", "aiosqlite")
    assert [p["requests"] for p in report["paths"]] == [16, 16, 16, 20, 20]
    # Effects: 20 warm-up debits on each of four debit routes, 2 x 8 bare, 2 x 8 first-time keys through the
    # middleware (then replayed: no effect), 2 x 40 bare and 2 x 40 first-time in the pass counting round trips, 8
    # and 8 in the pass with the collector stopped (as many as --requests, at most 200).
    assert report["exactly_once"] == {"verified": True, "effects": 80 + 16 + 16 + 160 + 16,
                                      "records": 60 + 16 + 80 + 8 + 20}
    bare, first, replay = report["paths"][:3]
    assert all(p["server_cpu_us_per_request"] > 0 and p["latency_ms"]["p50"] > 0 for p in report["paths"])
    assert first["cpu_ratio_to_bare"] > 0 and replay["ratio_to_bare"] > 0 and len(first["cpu_ratios"]) == 2
    # The record's statements ride in the effect's transaction: a first-time request sends more than the bare one,
    # a replay no more than a first-time one. SQLite has no wire: no round trips, and the report says why.
    assert 0 < bare["statements_per_request"] < first["statements_per_request"]
    assert 0 < replay["statements_per_request"] <= first["statements_per_request"]
    assert report["wire"]["counted"] is False and bare["round_trips_per_request"] is None
    # The garbage collector: collections counted per generation; no request through the middleware leaves a
    # reference cycle (what the collector alone frees), as none through the bare endpoint does; the startup heap
    # frozen by the app's lifespan (the default), and let go once the server stopped.
    assert all(set(p["collections"]) == {"gen0", "gen1", "gen2"} for p in (bare, first, replay))
    assert [p["cyclic_objects_per_request"] for p in (bare, first, replay)] == [0, 0, 0]
    assert report["config"]["gc_freeze"] and report["heap"]["frozen_objects"] > report["heap"]["tracked_objects"] > 0
    assert gc.get_freeze_count() == 0
    assert {t["target"] for t in report["targets"]} >= {"full garbage collections per 1,000 first-time requests",
                                                        "full garbage collections per 1,000 replays"}


def test_http_bench_without_freezing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sqlite", "--api", "http", "--requests", "4", "--concurrency", "2", "--repetitions", "1",
                 "--no-gc-freeze", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "the startup heap not frozen (--no-gc-freeze); once warm, a full collection scans" in out
    assert "garbage collections per 1,000 requests, generation 0 / 1 / 2" in out


def test_options_of_another_api_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sqlite", "--api", "http", "--workers", "4"]) == 64
    assert "--workers is for --api sync" in capsys.readouterr().err
