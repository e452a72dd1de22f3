"""README's code blocks and the getting-started page's examples, as a user copies them: each block a script of its
own, run twice in a row (a second run meets the tables and records of the first), on every engine this machine
runs — SQLite, PostgreSQL and MariaDB — with only the URL in the code changed. Each engine's run gets a database of
its own (dropped after), so runs beside other test runs on the shared servers never meet.

Sybil runs the documentation's blocks on SQLite too (docs/conftest.py); this adds the server engines and the
second run, and README, which Sybil does not read.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from idem_dialects.engines import Unavailable, get

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"README": ROOT / "README.md", "getting-started": ROOT / "docs" / "getting-started.md"}
# A database URL literal in a block: "dialect[+driver]://...".
URL_LITERAL = re.compile(r"""(["'])((?:sqlite|postgresql|mysql|mariadb)(?:\+(\w+))?://[^"']*)\1""")
ASYNC_DRIVERS = {"aiosqlite", "asyncpg", "asyncmy", "aiomysql", "psycopg_async"}
# README's HTTP block defines the app only (its full lifespan is in examples/); this drives it as a client would.
DRIVE_README_APP = """
import asyncio
from fastapi.testclient import TestClient

async def _tables():
    await store.create_tables()
    async with store.engine.begin() as conn:
        await conn.run_sync(payments.metadata.create_all)
    await store.engine.dispose()

asyncio.run(_tables())
with TestClient(app) as client:
    headers = {"X-Account": "1", "Idempotency-Key": '"readme-pay-42"'}
    first = client.post("/payments", json={"amount": 100}, headers=headers)
    retry = client.post("/payments", json={"amount": 100}, headers=headers)
assert first.status_code == retry.status_code == 201, (first.text, retry.text)
assert retry.content == first.content and retry.headers["idempotent-replayed"] == "true"
"""


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """The ```python blocks of a Markdown page that a reader would copy (not those the page says to skip), with
    their line numbers."""
    text_ = page.read_text(encoding="utf-8")
    blocks = []
    for found in re.finditer(r"^```python\n(.*?)^```", text_, re.S | re.M):
        before = text_[: found.start()].rstrip().splitlines()[-1:] or [""]
        if before[0].startswith("% skip"):
            continue
        blocks.append((text_.count("\n", 0, found.start()) + 1, found.group(1)))
    return blocks


@dataclass(frozen=True)
class Target:
    name: str
    sync_url: str
    async_url: str


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """A fresh, empty database of the engine: a file in the test's directory, or a database of its own on the
    machine's server (created now, dropped after)."""
    name = request.param
    if name == "sqlite":
        yield Target(name, "sqlite:///app.db", "sqlite+aiosqlite:///app.db")
        return
    try:
        server = get(name).provide()
    except Unavailable as exc:
        pytest.skip(f"{name} unavailable: {exc}")
    database = f"idem_examples_{secrets.token_hex(4)}"
    admin = create_engine(server.url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {database}"))
        url: URL = server.url.set(database=database)
        backend = url.get_backend_name()
        async_driver = {"postgresql": "asyncpg", "mariadb": "asyncmy"}[name]
        yield Target(name, url.render_as_string(hide_password=False),
                     url.set(drivername=f"{backend}+{async_driver}").render_as_string(hide_password=False))
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {database}"))
        admin.dispose()
        server.stop()


def with_url(block: str, target: Target) -> str:
    """The block with each database URL replaced by the target's (its async URL where the block's driver is
    asyncio-only): the only change a reader makes."""
    def replace(found: re.Match[str]) -> str:
        quote, _, driver = found.groups()
        return f"{quote}{target.async_url if driver in ASYNC_DRIVERS else target.sync_url}{quote}"

    changed, count = URL_LITERAL.subn(replace, block)
    assert count, f"no database URL in this block:\n{block}"
    return changed


def run_script(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("page", list(PAGES))
def test_examples_run_twice_on_every_engine_with_only_the_url_changed(page: str, target: Target,
                                                                      tmp_path: Path) -> None:
    pytest.importorskip("fastapi", reason="the [fastapi] extra is not installed")
    pytest.importorskip("flask", reason="the [flask] extra is not installed")
    blocks = python_blocks(PAGES[page])
    assert len(blocks) >= 2, f"{page} has fewer python blocks than expected"
    for attempt in (1, 2):
        for line, block in blocks:
            code = with_url(block, target)
            if page == "README" and "IdempotencyMiddleware" in block:
                code += DRIVE_README_APP
            done = run_script(code, tmp_path)
            assert done.returncode == 0, (f"{page} line {line}, run {attempt} on {target.name} failed:\n"
                                          f"{done.stderr[-3000:]}")
