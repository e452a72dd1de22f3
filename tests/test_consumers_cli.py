"""The workshop's consumer commands: `idem-dialects consumers` (the proof's table) and `idem-dialects bench --api
consumer` (messages/s beside the bare consumer): their bad arguments, and a small real run of each."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from idem_dialects.cli import main
from idem_dialects.cli.commands import EXIT_USAGE


@pytest.mark.parametrize(("argv", "said"), [
    (["consumers", "--messages", "5"], "--messages must be at least 10"),
    (["consumers", "--duplicates", "1"], "--duplicates in [0, 1)"),
    (["consumers", "--engine", "no-such-engine"], "no-such-engine"),
    (["bench", "sqlite", "--api", "consumer", "--messages", "0"], "--messages and --repetitions must be at least 1"),
    (["bench", "sqlite", "--api", "consumer", "--broker", "kafka"], "unknown broker 'kafka'"),
    (["bench", "sqlite", "--api", "sync", "--broker", "redis"], "--broker is for --api consumer"),
])
def test_bad_arguments_are_usage_errors(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == EXIT_USAGE
    assert said in capsys.readouterr().err


def test_consumers_prints_the_proof(broker: Callable[..., str], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    broker("redis")
    out = tmp_path / "proof.json"
    assert main(["consumers", "--broker", "redis", "--engine", "sqlite", "--messages", "60", "--kills", "1",
                 "--format", "json", "--output", str(out), "--quiet"]) == 0
    (run,) = json.loads(out.read_text())
    assert run["ok"] and run["published"] == 60 and run["distinct"] == 48 and len(run["kills"]) == 1
    assert run["effects"] == run["applied"] == 48 and run["lost"] == run["twice"] == run["left"] == 0
    assert main(["consumers", "--broker", "redis", "--engine", "sqlite", "--messages", "20", "--kills", "0",
                 "--quiet"]) == 0
    assert "| redis | sqlite | 20 | 16 | 4 | 0 (0/0/0) |" in capsys.readouterr().out


def test_bench_measures_the_consumer_beside_the_bare_one(broker: Callable[..., str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    broker("redis")
    assert main(["bench", "sqlite", "--api", "consumer", "--broker", "redis", "--messages", "40",
                 "--repetitions", "1", "--format", "json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "idem-dialects-bench-consumer/1"
    redis = report["brokers"]["redis"]
    assert redis["bare"]["per_s"] > 0 and redis["idempotent"]["per_s"] > 0 and redis["ratio_to_bare"] > 0
    assert report["exactly_once"] == {"effects": 160, "distinct_messages": 160}  # warm-up rounds included
