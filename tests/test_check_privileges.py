"""`idem-dialects check` as an ordinary PostgreSQL role, one without CREATEDB (issue 47): the whole suite exits 0,
and the checks that need a second database (the shard checks) are reported skipped, saying why. The role and its
database are made on the machine's PostgreSQL 15 for the test and dropped after."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from idem_dialects.engines import Unavailable, get


@pytest.fixture
def ordinary_role() -> Iterator[URL]:
    """A role with LOGIN only (no CREATEDB, no superuser), owning a database of its own."""
    try:
        server = get("postgresql").provide()
    except Unavailable as exc:
        pytest.skip(f"postgresql unavailable: {exc}")
    admin = create_engine(server.url.set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT",
                          poolclass=NullPool)
    name = f"idem_plain_{secrets.token_hex(3)}"
    try:
        with admin.connect() as conn:
            if conn.exec_driver_sql("SELECT rolcreatedb FROM pg_roles WHERE rolname = current_user").scalar_one() \
                    is not True and not conn.exec_driver_sql("SELECT rolsuper FROM pg_roles WHERE rolname ="
                                                             " current_user").scalar_one():
                pytest.skip("the server's user may not create the role and database this test needs")
            conn.exec_driver_sql(f"CREATE ROLE {name} LOGIN NOCREATEDB NOSUPERUSER")
            conn.exec_driver_sql(f"CREATE DATABASE {name} OWNER {name}")
        yield server.url.set(drivername="postgresql+psycopg", username=name, password=None, database=name)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.exec_driver_sql(f"DROP ROLE IF EXISTS {name}")
        admin.dispose()
        server.stop()


@pytest.mark.slow  # the whole check on PostgreSQL, about a minute and a half
def test_check_as_a_role_without_createdb_exits_0_with_the_shard_checks_skipped(ordinary_role: URL) -> None:
    done = subprocess.run([sys.executable, "-m", "idem_dialects.cli", "check",
                           ordinary_role.render_as_string(hide_password=False), "--format", "json", "--quiet"],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report: Any = json.loads(done.stdout)
    results = {check["id"]: check["results"]["target"] for check in report["checks"]}
    shard = {name: found for name, found in results.items() if "shard" in name}
    assert shard, sorted(results)
    for name, found in shard.items():
        assert found["outcome"] == "skipped", (name, found)
        assert "may not create a database" in found["reason"], (name, found)
    assert not [name for name, found in results.items() if found["outcome"] == "failed"]
