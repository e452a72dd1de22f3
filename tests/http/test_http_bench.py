"""`idem-dialects bench --api http` runs end to end (a real uvicorn server, keep-alive connections) and its
exactly-once check passes; no timings."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("uvicorn", reason="the [http] extra (uvicorn) is not installed")
pytest.importorskip("aiosqlite", reason="the [async] extra (aiosqlite) is not installed")

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
    assert "server CPU per request, middleware first-time <= 1.6x the bare endpoint's" in out


def test_http_bench_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sqlite", "--api", "http", "--requests", "8", "--concurrency", "2", "--quiet",
                 "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "idem-dialects-bench-http/2"
    assert (report["engine"]["name"], report["engine"]["driver"]) == ("sqlite", "aiosqlite")
    assert [p["requests"] for p in report["paths"]] == [8, 8, 8, 20, 20]
    # Effects: 2 x 20 warm-up debits, 8 bare, 8 first-time keys through the middleware (then replayed: no effect).
    assert report["exactly_once"] == {"verified": True, "effects": 40 + 8 + 8, "records": 40 + 8 + 20}
    first, replay = report["paths"][1:3]
    assert all(p["server_cpu_us_per_request"] > 0 and p["latency_ms"]["p50"] > 0 for p in report["paths"])
    assert first["cpu_ratio_to_bare"] > 0 and replay["ratio_to_bare"] > 0


def test_options_of_another_api_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sqlite", "--api", "http", "--workers", "4"]) == 64
    assert "--workers is for --api sync" in capsys.readouterr().err
