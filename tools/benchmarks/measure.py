"""Running the plan: each run in turn through a checkout's own CLI, its report and log in the output directory, and
what ran (command, duration, load average, outcome) in manifest.json, rewritten after every run so that a run cut
short still renders what it measured."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from .plan import Run, Side, Sizes

MANIFEST = "manifest.json"
SCHEMA = "idem-dialects-benchmarks/1"
# Exit statuses of `idem-dialects` (idem_dialects.cli.commands): 1 exactly-once violated or a check failed,
# 2 an engine unavailable, 64 a usage error.
FAILED, UNAVAILABLE, USAGE = 1, 2, 64
# A URL no database answers at: a probe's bench stops at the connection, after its options were accepted or not.
PROBE_URL = "sqlite:////nonexistent-benchmarks-probe/probe.db"


def one_cpu() -> set[int] | None:
    """Where a pinned run goes: the last CPU this process may use. None where it may use one only, or the system
    cannot pin a process (not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = os.sched_getaffinity(0)
    return {max(cpus)} if len(cpus) > 1 else None


def environment() -> dict[str, str]:
    """The runs' environment: this one without what would make a checkout's Python import another tree's code."""
    return {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PYTHONHOME")}


class RunFailed(Exception):
    """A run the page cannot vouch for: exactly-once violated, a request failed, or the command line was refused."""


@dataclass(frozen=True)
class Checkout:
    """A source tree with its own virtualenv (`.venv`), whose `idem-dialects` runs its own code."""

    side: Side
    path: Path

    @property
    def cli(self) -> Path:
        return self.path / ".venv" / "bin" / "idem-dialects"

    def problem(self) -> str | None:
        if not self.cli.exists():
            return f"{self.cli} does not exist: make the checkout's virtualenv (python3 -m venv .venv &&" \
                   " .venv/bin/pip install -e '.[all]' -e tools/bench, where it has tools/bench)"
        return None

    def describe(self) -> dict[str, Any]:
        def git(*args: str) -> str:
            done = subprocess.run(["git", "-C", str(self.path), *args], capture_output=True, text=True, check=False)
            return done.stdout.strip()

        return {"path": str(self.path), "commit": git("rev-parse", "HEAD"), "subject": git("log", "-1", "--format=%s"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def machine() -> dict[str, Any]:
    """What the figures were measured on: processor, cores, memory, system."""
    model = None
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), None)
        memory_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                          if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        memory_kib = 0
    return {"processor": model or platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "memory_gib": round(memory_kib / 1024 / 1024, 1) if memory_kib else None,
            "system": platform.platform(), "python": sys.version.split()[0]}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Manifest:
    """OUTPUT_DIR/manifest.json: the invocation, the machine, the checkouts and every run's outcome."""

    def __init__(self, out: Path, data: dict[str, Any]) -> None:
        self.out, self.data = out, data

    @classmethod
    def load(cls, out: Path) -> Manifest:
        path = out / MANIFEST
        if path.exists():
            return cls(out, json.loads(path.read_text()))
        return cls(out, {"schema": SCHEMA, "runs": {}})

    @classmethod
    def start(cls, out: Path, command: list[str], sizes: Sizes, smoke: bool, checkouts: Iterable[Checkout],
              resume: bool) -> Manifest:
        old = cls.load(out) if resume else cls(out, {"runs": {}})
        data = {"schema": SCHEMA, "command": command, "started": now(), "finished": None, "smoke": smoke,
                "sizes": asdict(sizes), "machine": machine(),
                "checkouts": {c.side: c.describe() for c in checkouts},
                "dropped": old.data.get("dropped", {}) if resume else {},
                "runs": old.data.get("runs", {}) if resume else {}}
        manifest = cls(out, data)
        manifest.save()
        return manifest

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        tmp.replace(self.out / MANIFEST)

    def done(self, run: Run) -> bool:
        entry = self.data["runs"].get(run.id)
        return bool(entry and entry["status"] in ("ok", "unavailable") and (
            entry["status"] == "unavailable" or (self.out / run.file).exists()))

    def record(self, run: Run, **outcome: Any) -> None:
        self.data["runs"][run.id] = {"kind": run.kind, "engines": list(run.engines), "driver": run.driver,
                                     "levels": list(run.levels), "side": run.side, "round": run.round,
                                     "file": run.file, **outcome}
        self.save()


def supports(checkout: Checkout, api: str, option: str, value: str) -> bool:
    """Whether the checkout's bench takes `option` for `--api api`: a usage error (64) says it does not; a run that
    gets as far as the (unreachable) database says it does."""
    done = subprocess.run([str(checkout.cli), "bench", PROBE_URL, "--api", api, option, value, "--quiet", "--format",
                           "json"], capture_output=True, text=True, timeout=300, check=False, env=environment())
    return done.returncode != USAGE


def dropped_options(runs: list[Run], checkouts: dict[Side, Checkout], manifest: Manifest) -> frozenset[str]:
    """The optional options of the before/after runs that some checkout refuses: both sides run without them, so that
    the two are measured alike (the page says which)."""
    wanted = {(run.kind, option, value) for run in runs for option, value in run.optional}
    dropped: set[str] = set()
    for api, option, value in sorted(wanted):
        refused = [c.side for c in checkouts.values() if not supports(c, api, option, value)]
        if refused:
            dropped.add(option)
            manifest.data["dropped"][f"{option} (--api {api})"] = f"the {' and '.join(refused)} checkout's bench" \
                                                                   f" does not take {option} for --api {api}"
    manifest.save()
    return frozenset(dropped)


def last_lines(path: Path, count: int = 3) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return " / ".join(lines[-count:])


def execute(run: Run, checkout: Checkout, manifest: Manifest, dropped: frozenset[str] = frozenset(),
            echo: bool = True) -> None:
    """Run one command; its report to OUTPUT_DIR/<id>.json, its output to OUTPUT_DIR/logs/<id>.log. An unavailable
    engine is recorded and skipped; anything else that fails raises RunFailed."""
    out = manifest.out
    argv = run.argv(dropped)
    (out / run.file).parent.mkdir(parents=True, exist_ok=True)
    log = out / "logs" / f"{run.id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    if echo:
        print(f"== {run.id} ({run.side}): idem-dialects {' '.join(argv)}", file=sys.stderr, flush=True)
    cpus = one_cpu() if run.pinned else None
    load_before, started = os.getloadavg()[0], time.perf_counter()
    with log.open("w") as sink:
        # Set in the child before it starts: every thread the bench makes inherits it.
        code = subprocess.run([str(checkout.cli), *argv], cwd=out, stdout=sink, stderr=subprocess.STDOUT,
                              check=False, env=environment(),
                              preexec_fn=None if cpus is None else partial(os.sched_setaffinity, 0, cpus)).returncode
    seconds, load_after = round(time.perf_counter() - started, 1), os.getloadavg()[0]
    outcome: dict[str, Any] = {"argv": ["idem-dialects", *argv], "exit_status": code, "seconds": seconds,
                               "load": [round(load_before, 2), round(load_after, 2)], "finished": now(),
                               "dropped": sorted(dropped.intersection(o for o, _ in run.optional)),
                               "cpus": None if cpus is None else sorted(cpus)}
    written = (out / run.file).exists()
    if code == 0 or (run.kind == "conformance" and code == FAILED and written):
        manifest.record(run, status="ok", **outcome)
    elif code == UNAVAILABLE:
        manifest.record(run, status="unavailable", reason=last_lines(log, 2), **outcome)
        if echo:
            print(f"   unavailable, skipped: {last_lines(log, 2)}", file=sys.stderr, flush=True)
    else:
        violated = "EXACTLY-ONCE VIOLATED" in log.read_text(errors="replace")
        manifest.record(run, status="failed", reason=last_lines(log), violated=violated, **outcome)
        raise RunFailed(f"{run.id}: idem-dialects exited {code}: {last_lines(log)} (log: {log})")
    if echo:
        print(f"   {seconds:.0f} s, load average {load_before:.1f} -> {load_after:.1f}", file=sys.stderr, flush=True)
