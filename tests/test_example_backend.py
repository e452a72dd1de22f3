"""The worked third-party backend (examples/backend_package): a distribution of its own, installed beside the project
in a fresh venv, registered only by its entry points, passes `idem-dialects check` on a live engine (SQLite: its
engine `examplelite` is SQLAlchemy's SQLite dialect under a name of its own)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # a venv installed from the package index
def test_the_example_backend_passes_check(tmp_path: Path) -> None:
    # Installed from a copy of the sources: setuptools writes build/ and egg-info beside the ones it builds.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "node_modules"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "IDEM_", "VIRTUAL_ENV"))}
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{src}[conformance]",
                                str(src / "examples" / "backend_package")],
                               capture_output=True, text=True, env=env, timeout=900)
    assert installed.returncode == 0, installed.stderr[-4000:]
    report = tmp_path / "report.json"
    done = subprocess.run([str(venv / "bin" / "idem-dialects"), "check", f"examplelite:///{tmp_path / 'app.db'}",
                           "--format", "json", "--output", str(report), "--quiet"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    found = json.loads(report.read_text(encoding="utf-8"))
    assert found["engines"]["target"]["backend"] == "examplelite"
    summary = found["summary"]
    assert summary["failed"] == 0 and summary["passed"] > 0 and summary["exit_status"] == 0
