"""`bench --measure telemetry` and `--measure purge`: they run on a real database and report what the docs quote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from idem_dialects_bench import purge as purge_bench

from idem_dialects.cli import main


def test_telemetry_overhead_is_measured_under_each_telemetry(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK (the [dev] extra)")
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert main(["bench", url, "--measure", "telemetry", "--requests", "30", "--repetitions", "2", "--warmup", "5",
                 "--format", "json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "idem-dialects-bench-telemetry/3" and report["engine"]["backend"] == "sqlite"
    conditions = {"off", "api", "sdk", "traces only", "metrics only", "sampled", "dropped", "one span",
                  "cursor events", "sqlalchemy"}  # the instrumentation is in the [dev] extra
    assert set(report["replay"]) == conditions and set(report["overhead"]) == conditions - {"off"}
    assert report["baseline"]["sqlalchemy"] == "cursor events" and report["baseline"]["dropped"] == "off"
    assert all(row["wall_us"] > 0 and row["cpu_us"] > 0 for row in report["replay"].values())
    # The SDK really recorded every measured replay: the library's run spans, and a span per statement under the
    # SQLAlchemy instrumentation.
    assert report["spans_exported"] >= 60 * 2


def test_purge_cost_is_measured_beside_concurrent_claims(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(purge_bench, "BASELINE_SECONDS", 0.5)
    monkeypatch.setattr(purge_bench, "SETTLE_SECONDS", 0.0)
    monkeypatch.setattr(purge_bench, "DURING_FLOOR", 0.2)
    url = f"sqlite:///{tmp_path / 'p.db'}"
    assert main(["bench", url, "--measure", "purge", "--rows", "3000", "--batch-size", "500", "--workers", "2",
                 "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "3,000 old of 3,000 records, delete in batches of 500" in text and "during retention" in text
    assert "rows/s" in text and "of their rate (alone, before and after) during retention" in text


@pytest.mark.parametrize("mode", ["delete", "delete-default-isolation", "generations"])
def test_retention_modes_are_measured_before_and_after(mode: str, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every mode on the machine's PostgreSQL: old rows beside recent ones, every old one gone."""
    from idem_dialects.engines import Unavailable, get

    try:
        server = get("postgresql").provide()
    except Unavailable as exc:
        pytest.skip(f"postgresql unavailable: {exc}")
    monkeypatch.setattr(purge_bench, "BASELINE_SECONDS", 0.5)
    monkeypatch.setattr(purge_bench, "SETTLE_SECONDS", 0.0)
    monkeypatch.setattr(purge_bench, "DURING_FLOOR", 0.2)
    assert main(["bench", server.url.render_as_string(hide_password=False), "--measure", "purge", "--rows", "3000",
                 "--recent", "2000", "--purge-mode", mode, "--format", "json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "idem-dialects-bench-purge/3" and report["mode"] == mode
    assert report["rows"] == 3000 and report["recent"] == 2000 and report["kept_ratio"] > 0


def test_measure_needs_one_engine() -> None:
    assert main(["bench", "--engine", "sqlite", "--engine", "postgresql", "--measure", "purge", "--quiet"]) == 64
