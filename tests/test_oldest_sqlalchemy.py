"""The oldest SQLAlchemy release the project supports (pyproject's floor) runs the conformance suite as the newest
does: a fresh venv with that release, the suite's one line in a fresh project, on SQLite (sync and async) and on the
PostgreSQL server (async: asyncpg and psycopg, where SQLAlchemy's private adapter names differ between 2.0 and 2.1;
the sync store's are the ones SQLite's checks cover). The rest of the test command runs on the newest release."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from idem_dialects import engines

ROOT = Path(__file__).resolve().parent.parent


def oldest() -> str:
    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    found = next(re.fullmatch(r"SQLAlchemy>=([\d.]+),.*", r) for r in requirements if r.startswith("SQLAlchemy"))
    assert found is not None, requirements
    return found.group(1)


@pytest.mark.slow
def test_the_suite_passes_on_the_oldest_supported_sqlalchemy(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    version = oldest()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    made = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-e", str(ROOT),
                           f"SQLAlchemy=={version}", "pytest", "psycopg[binary]", "asyncpg", "aiosqlite", "greenlet"],
                          capture_output=True, text=True, timeout=600)
    if made.returncode != 0:
        pytest.skip(f"SQLAlchemy {version} and the drivers cannot be installed here: {made.stderr[-500:]}")
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text('pytest_plugins = ["idem_dialects.conformance.plugin"]\n', encoding="utf-8")
    (project / "test_conformance.py").write_text("from idem_dialects.conformance.suite import *  # noqa: F403\n",
                                                 encoding="utf-8")
    (project / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    required = set(request.config.getoption("idem_require") or ())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # no option of this run leaks in
    runs = [["--idem-engine", "sqlite", "--idem-api", "both"], ["--idem-engine", "postgresql", "--idem-api", "async"]]
    for argv in runs:
        engine = argv[1]
        if engine not in required and "all" not in required:
            try:
                engines.get(engine).provide().stop()
            except engines.Unavailable as exc:
                pytest.skip(f"the checks on SQLite passed on SQLAlchemy {version}; {engine}: {exc}")
        else:
            argv += ["--idem-require", engine]
        done = subprocess.run([str(python), "-c", "import sqlalchemy; print(sqlalchemy.__version__)"],
                              capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == version
        done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *argv], cwd=project,
                              capture_output=True, text=True, timeout=1200, env=env)
        assert done.returncode == 0, f"SQLAlchemy {version}, {' '.join(argv)}:\n{done.stdout[-6000:]}"
