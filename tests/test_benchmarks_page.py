"""tools/benchmarks renders BENCHMARKS.md from the bench's own JSON reports: every section, every table, no
placeholder left, with all runs present or none. The reports come from tiny real runs on SQLite (no timing is
asserted); the page's other engines are filled with copies of them, relabelled, so that every table has its rows."""

from __future__ import annotations

import copy
import importlib
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from idem_dialects.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tools() -> Iterator[dict[str, ModuleType]]:
    sys.path.insert(0, str(ROOT))  # tools/ is not installed: the command runs it from the checkout
    try:
        yield {name: importlib.import_module(f"tools.benchmarks.{name}")
               for name in ("plan", "measure", "render", "targets")}
    finally:
        sys.path.remove(str(ROOT))


def sections() -> list[str]:
    template = (ROOT / "tools" / "benchmarks" / "BENCHMARKS.md.in").read_text()
    return re.findall(r"^##+ .+$", template, flags=re.M)


def bench(out: Path, name: str, *argv: str) -> dict[str, Any]:
    path = out / f"{name}.json"
    assert main(["bench", *argv, "--format", "json", "--output", str(path), "--quiet"]) == 0
    report: dict[str, Any] = json.loads(path.read_text())
    return report


def as_engine(report: dict[str, Any], engine: str, driver: str | None = None) -> dict[str, Any]:
    """A SQLite report standing in for another engine's (the page reads the engine's name from it)."""
    twin = copy.deepcopy(report)
    for run in twin.get("runs", [twin]):
        run["engine"].update(name=engine, server_version="0.0")
        if driver:
            run["engine"]["driver"] = driver
    return twin


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory, tools: dict[str, ModuleType]) -> Path:
    """An output directory as the command leaves it: a report per planned run, and the manifest."""
    plan, measure = tools["plan"], tools["measure"]
    out = tmp_path_factory.mktemp("bench")
    raw = tmp_path_factory.mktemp("raw")
    url = f"sqlite:///{raw / 'bench.db'}"
    levels = ",".join(str(n) for n in plan.LEVELS)
    made = {
        "sync": bench(raw, "sync", url, "--workers", levels, "--requests", "32", "--repetitions", "1", "--warmup", "2"),
        # Not 32 tasks: 32 concurrent writers queue on SQLite's lock for seconds; the page shows the level as missing.
        "async": bench(raw, "async", url, "--api", "async", "--concurrency", "1,8", "--requests", "16",
                       "--repetitions", "2", "--sleep", "0.005"),
        "http": bench(raw, "http", "sqlite", "--api", "http", "--concurrency", "1,16", "--requests", "6"),
        "memory": bench(raw, "memory", url, "--requests", "4", "--repetitions", "1", "--warmup", "0",
                        "--memory-check", "20"),
    }
    if importlib.util.find_spec("opentelemetry.sdk") is not None:
        made["telemetry"] = bench(raw, "telemetry", url, "--measure", "telemetry", "--requests", "5",
                                  "--repetitions", "1", "--warmup", "1")
    manifest = measure.Manifest.start(out, ["tools/benchmarks.sh", str(out), "--smoke"], plan.SMOKE, True,
                                      [measure.Checkout("after", ROOT), measure.Checkout("before", ROOT)], False)
    for run in [*plan.main_runs(plan.SMOKE, memory=True), *plan.ab_runs(plan.SMOKE)]:
        if run.kind == "consumer" or run.kind not in made:
            manifest.record(run, status="unavailable", reason="not here in this test", argv=["idem-dialects"],
                            seconds=0.1, load=[0.1, 0.2])
            continue
        report = as_engine(made[run.kind], run.engines[0], run.driver)
        if run.round is not None:  # one level of the set, as a before/after run writes it
            report = next(r for r in report["runs"] if (r["config"].get("workers") or r["config"]["concurrency"])
                          == run.levels[0])
        (out / run.file).parent.mkdir(parents=True, exist_ok=True)
        (out / run.file).write_text(json.dumps(report))
        manifest.record(run, status="ok", argv=["idem-dialects", *run.argv()], seconds=1.0, load=[0.5, 0.7],
                        cpus=[1] if run.pinned else None)
    manifest.data["finished"] = measure.now()
    manifest.save()
    return out


def assert_complete(page: str) -> None:
    assert "{{" not in page, re.findall(r".{0,40}\{\{.{0,40}", page)
    missing = [title for title in sections() if title not in page.splitlines()]
    assert missing == []
    for banned in ("the issue", "remaining work", "this round"):
        assert banned not in page.lower()


@pytest.mark.slow  # runs every benchmark once, briefly
def test_page_from_every_run(measured: Path, tools: dict[str, ModuleType]) -> None:
    render, targets = tools["render"], tools["targets"]
    page = render.render(measured)
    assert_complete(page)
    assert "**A smoke run" in page and "No run behind this page" not in page
    assert "| 32 | replay |" in page  # the sync and async tables reach 32
    assert "BEGIN IMMEDIATE" in page  # statements per request, from the reports
    # the before/after table
    assert "first-time client CPU \N{MICRO SIGN}s (after \N{DIVISION SIGN} before; by round)" in page
    assert "Every run's process was held to one CPU (CPU 1 of the machine's" in page
    assert "`--workers` N[,N...]" in page  # the options table, from the CLI's own parser
    found = targets.targets(render.Reports(measured))
    measured_kinds = {t.name for t in found if t.measured is not None}
    times, over = "\N{MULTIPLICATION SIGN}", "\N{DIVISION SIGN}"
    assert {"client CPU per replay", f"replays {times} the bare effect", f"client CPU per request after {over} before",
            "memory growth per 10,000 requests", f"replay p99 {over} its p50"} <= measured_kinds
    rows = [line for line in page.split("## Targets", 1)[1].split("\n## ", 1)[0].splitlines()
            if line.startswith("| ") and not line.startswith("| target")]
    assert len(rows) == len(found)


def test_page_from_no_run(tmp_path: Path, tools: dict[str, ModuleType]) -> None:
    """Nothing measured yet: every section still renders, each table saying why it is empty."""
    page = tools["render"].render(tmp_path)
    assert_complete(page)
    assert "No run behind this page" in page and "not run: add --memory" in page


def test_unknown_placeholder_is_an_error(tmp_path: Path, tools: dict[str, ModuleType]) -> None:
    template = tmp_path / "page.md.in"
    template.write_text("# x\n\n{{ no_such_block }}\n")
    with pytest.raises(ValueError, match="no_such_block"):
        tools["render"].render(tmp_path, template)


def test_before_after_plan_alternates_sides(tools: dict[str, ModuleType]) -> None:
    """Each (API, engine, driver, level) runs on both checkouts in every round, the side that goes first
    alternating, so that drift of the machine falls on both alike."""
    plan = tools["plan"]
    runs = plan.ab_runs(plan.Sizes(ab_rounds=2))
    firsts = [runs[i].side for i in range(0, len(runs), 2)]
    assert all(runs[i].side != runs[i + 1].side and runs[i].args == runs[i + 1].args for i in range(0, len(runs), 2))
    assert firsts.count("before") == firsts.count("after")
    assert len({run.id for run in runs}) == len(runs)


@pytest.mark.skipif(len(getattr(os, "sched_getaffinity", lambda _: ())(0)) < 2, reason="pinning needs 2 CPUs or more")
def test_before_after_runs_are_pinned_to_one_cpu(tmp_path: Path, tools: dict[str, ModuleType]) -> None:
    """A before/after run's process, and so every thread its bench starts, runs on one CPU, which the manifest
    records and the page names; the other runs are left where the scheduler puts them."""
    plan, measure = tools["plan"], tools["measure"]
    cli = tmp_path / "checkout" / ".venv" / "bin" / "idem-dialects"
    cli.parent.mkdir(parents=True)
    # A stand-in CLI: writes its own CPUs where the run's report goes (the argument after --output).
    cli.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                   "output = sys.argv[sys.argv.index('--output') + 1]\n"
                   "open(output, 'w').write(json.dumps(sorted(os.sched_getaffinity(0))))\n")
    cli.chmod(0o755)
    checkout = measure.Checkout("after", cli.parents[2])
    out = tmp_path / "out"
    manifest = measure.Manifest.start(out, ["x"], plan.SMOKE, True, [checkout], False)
    pinned, free = plan.ab_runs(plan.SMOKE)[0], plan.main_runs(plan.SMOKE)[0]
    assert pinned.pinned and not free.pinned
    for run in (pinned, free):
        measure.execute(run, checkout, manifest, echo=False)
    cpu = max(os.sched_getaffinity(0))
    assert json.loads((out / pinned.file).read_text()) == [cpu]
    assert manifest.data["runs"][pinned.id]["cpus"] == [cpu]
    assert json.loads((out / free.file).read_text()) == sorted(os.sched_getaffinity(0))
    assert manifest.data["runs"][free.id]["cpus"] is None
