"""The HTTP bench runs end to end (a real uvicorn server, httpx) and its exactly-once check passes; no timings."""

from __future__ import annotations

import pytest

pytest.importorskip("uvicorn", reason="the [http] extra (uvicorn) is not installed")
pytest.importorskip("aiosqlite", reason="the [async] extra (aiosqlite) is not installed")


def test_http_bench_on_sqlite_checks_exactly_once(capsys: pytest.CaptureFixture[str]) -> None:
    from idem_dialects.cli.bench.http import main

    assert main(["--engine", "sqlite", "--requests", "40", "--concurrency", "4"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| sqlite |")]
    assert [row.split("|")[2:4] for row in rows] == [
        [" throughput ", " bare "], [" throughput ", " middleware (atomic) "],
        [" latency ", " bare "], [" latency ", " middleware (external call) "]]
    assert "exactly-once: balance and record count checked" in out
