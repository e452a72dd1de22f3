"""Drivers other than the defaults pass `idem-dialects check` (the conformance checks where drivers differ: protocol,
integrity violations, isolation levels, driver-level autocommit) on live servers: psycopg2, pg8000, mysql-connector
and an in-memory SQLite.
The whole suite was run with each as well (README: Supported drivers); this keeps the part that broke."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import URL

engines: Any = import_module("idem_dialects.engines")
SELECT = "integrity or isolation or autocommit or first_request or replay or mismatch"


@pytest.mark.parametrize(("engine", "driver", "module"), [
    ("postgresql", "postgresql+psycopg2", "psycopg2"),
    ("postgresql", "postgresql+pg8000", "pg8000"),
    ("mariadb", "mariadb+mysqlconnector", "mysql.connector"),
    ("sqlite", "sqlite+pysqlite", "sqlite3"),
])
def test_check_passes_with_driver(tmp_path: Path, engine: str, driver: str, module: str) -> None:
    if find_spec(module.split(".")[0]) is None:
        pytest.skip(f"{module} is not installed (the [dev] extra)")
    if engine == "sqlite":
        url: URL | str = "sqlite:///:memory:"
        server = None
    else:
        spec = engines.get(engine)
        try:
            server = spec.provide()
        except engines.Unavailable as exc:
            pytest.skip(f"{spec.name}: {exc}")
        url = server.url.set(drivername=driver)
    try:
        text = url if isinstance(url, str) else url.render_as_string(hide_password=False)
        report = tmp_path / "report.json"
        done = subprocess.run([sys.executable, "-m", "idem_dialects.cli", "check", text, "-k", SELECT, "--quiet",
                               "--format", "json", "--output", str(report)], capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, done.stderr[-6000:]
        summary = json.loads(report.read_text())["summary"]
        assert summary["failed"] == 0 and summary["passed"] >= 9, summary
    finally:
        if server is not None:
            server.stop()
