"""`bench --measure telemetry` and `--measure purge`: they run on a real database and report what the docs quote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from idem_dialects.cli import main
from idem_dialects.cli.bench import purge as purge_bench


def test_telemetry_overhead_is_measured_under_each_telemetry(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK (the [test] extra)")
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert main(["bench", url, "--measure", "telemetry", "--requests", "30", "--repetitions", "2", "--warmup", "5",
                 "--format", "json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "idem-dialects-bench-telemetry/2" and report["engine"]["backend"] == "sqlite"
    assert set(report["replay"]) == {"off", "api", "sdk", "traces only", "metrics only", "sampled", "one span"}
    assert set(report["overhead"]) == {"api", "sdk", "traces only", "metrics only", "sampled", "one span"}
    assert all(row["wall_us"] > 0 and row["cpu_us"] > 0 for row in report["replay"].values())
    assert report["spans_exported"] >= 60  # the SDK really recorded every measured replay


def test_purge_cost_is_measured_beside_concurrent_claims(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(purge_bench, "BASELINE_SECONDS", 0.5)
    url = f"sqlite:///{tmp_path / 'p.db'}"
    assert main(["bench", url, "--measure", "purge", "--rows", "3000", "--batch-size", "500", "--workers", "2",
                 "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "3,000 rows in batches of 500" in text and "during purge" in text and "rows/s" in text


def test_measure_needs_one_engine() -> None:
    assert main(["bench", "--engine", "sqlite", "--engine", "postgresql", "--measure", "purge", "--quiet"]) == 64
