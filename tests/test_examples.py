"""Every code block of README and of the documentation, as a user copies it: in a fresh virtual environment with
only the package and the extras its page names in its `pip install` lines (plus the drivers of the engines it runs
on: [postgresql], [mysql]; and the packages a console block's `pip install` adds), each page's blocks in order in
one namespace (a console block's commands with bash), the whole page run twice in a row in one directory (the
second run meets the files, tables and records of the first), on SQLite, PostgreSQL and MariaDB where the page takes
a database URL (a relative sqlite:/// file, or a server's URL where the page needs what only a server has:
ON_SERVER), with only the URL changed. Each server run gets a database of its own per file name (or server URL) the
page uses (dropped after); virtual environments are shared per set of extras within one run, installed from
the run's wheel and wheelhouse (tests/wheel_common.py).

Sybil runs the same blocks in the development environment on SQLite (docs/conftest.py), once; this adds the fresh
environments, the server engines, the second run and README, which Sybil does not read. A page that takes a database
URL runs here on the servers only (on SQLite it is Sybil's); one that takes none, and README, run here on SQLite.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from wheel_common import Built, venv

from idem_dialects.engines import Unavailable, get

# Venvs from the run's wheel and wheelhouse (downloaded from the package index): not in the quick command.
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Pages whose blocks this cannot run outside Sybil, and why (Sybil still runs them: docs/conftest.py).
NOT_HERE = {
    "django.md": "fragments of a Django project (examples/django_postgres, run by tests/test_django_example.py),"
                 " set up by Sybil's invisible blocks from the source tree",
    "conformance.md": "its recipe's two test files are shown as their contents (tests/test_opt_in.py writes them"
                      " into a fresh project and runs it), and its install lines name [all], for a copy of the CI"
                      " workflow",
}
# Pages whose blocks take a server's URL for what only a server has: skipped on SQLite with the reason, run on each
# server with that URL changed to the server's.
ON_SERVER = {"faults.md": ("postgresql+psycopg://postgres@127.0.0.1:5432/test",
                           "the fault proxy cuts a server's connection, and SQLite has none")}
# A relative SQLite file in a block, or README's placeholder server (app.db on SQLite): the URLs a reader changes for
# another engine. An async store's URL is changed to the engine's async driver's.
SQLITE_FILE = re.compile(r"(AsyncIdempotencyStore\.from_url\(\\\")?(?:sqlite(\+aiosqlite)?:///([\w.-]+\.db)\b"
                         r"|(postgresql\+psycopg://app@db/app))")
NOT_RUN_ENGINES = {"mssql", "oracle", "aioodbc"}  # engines this machine has no server for: their drivers are not needed
ENGINE_DRIVERS = {"postgresql", "mysql"}  # each run engine's own extra, as getting-started's install table names it
# A page naming an async driver's extra runs its async blocks on every engine: each engine's, as getting-started says
# (psycopg with [async], asyncmy).
ASYNC_DRIVERS = {"aiosqlite", "asyncpg", "asyncmy", "async"}
ENGINE_ASYNC = {"aiosqlite", "async", "asyncmy"}
# README's HTTP block defines the app only (a server would run it): after it, a client sends what README's curl lines
# send, against the database as the block leaves it (its lifespan creates the tables).
DRIVE_README_APP = """
from fastapi.testclient import TestClient

with TestClient(app) as client:
    headers = {"X-Account": "1", "Idempotency-Key": '"readme-pay-42"'}
    first = client.post("/payments", json={"amount": 100}, headers=headers)
    retry = client.post("/payments", json={"amount": 100}, headers=headers)
assert first.status_code == retry.status_code == 201, (first.text, retry.text)
assert retry.content == first.content and retry.headers["idempotent-replayed"] == "true"
"""
# A block that runs in the page's namespace, or a console block's commands (bash, the venv's bin first on PATH).
RUNNER = r"""
import json, os, subprocess, sys
ns = {"__name__": "__main__"}
for step in json.load(open(sys.argv[1])):
    where = f"{step['page']} line {step['line']}"
    if step["kind"] == "python":
        exec(compile(step["code"], where, "exec"), ns)
        continue
    for command in step["commands"]:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command])
        if done.returncode:
            sys.exit(f"{where}: {command!r} exited {done.returncode}")
"""


pytest.importorskip("sybil", reason="sybil (the [dev] extra) is not installed: the skip lines need docs/conftest.py")


def live(engine: str) -> bool:
    spec = importlib.util.spec_from_file_location("docs_conftest", DOCS / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return bool(module.live(engine))


@dataclass
class Page:
    name: str
    path: Path
    steps: list[dict[str, object]] = field(default_factory=list)
    extras: frozenset[str] = frozenset()
    packages: frozenset[str] = frozenset()  # what a console block's `pip install` adds beside the package

    @property
    def files(self) -> list[str]:
        """The relative SQLite files its blocks name: a page that names one runs on every engine."""
        found = {m.group(3) or "app.db" for s in self.steps for m in SQLITE_FILE.finditer(json.dumps(s))}
        return sorted(found | ({ON_SERVER[self.name][0]} if self.name in ON_SERVER else set()))


def read_page(name: str, path: Path) -> Page:
    """The blocks a reader runs (a ```python or ```console block not skipped by the `% skip` line before it, or
    skipped only where a server is not live here) and the extras the page's `pip install` lines name."""
    text_ = path.read_text(encoding="utf-8")
    page = Page(name, path)
    for found in re.finditer(r"^```(python|console)\n(.*?)^```", text_, re.S | re.M):
        before = (text_[: found.start()].rstrip().splitlines() or [""])[-1]
        condition = re.fullmatch(r'% skip: next if\((.*), reason=.*\)', before)
        if before.startswith("% skip") and (condition is None or eval(condition.group(1), {"live": live})):
            continue
        line = text_.count("\n", 0, found.start()) + 2
        if found.group(1) == "python":
            page.steps.append({"kind": "python", "code": found.group(2), "page": name, "line": line})
            if name == "README" and "IdempotencyMiddleware" in found.group(2):
                page.steps.append({"kind": "python", "code": DRIVE_README_APP, "page": name, "line": line})
        else:  # each "$ " line, with its continuation lines; the other lines are the output the page shows
            commands = re.findall(r"^\$ ((?:.*\\\n)*.*)$", found.group(2), re.M)
            page.steps.append({"kind": "console", "commands": commands, "page": name, "line": line})
    named = {e for command in re.findall(r"pip install [^`\n]*", text_)
             for group in re.findall(r"idem-dialects\[([\w,-]+)\]", command) for e in group.split(",")}
    asynchronous = ENGINE_ASYNC if named & ASYNC_DRIVERS else set()
    page.extras = frozenset(named - NOT_RUN_ENGINES | ENGINE_DRIVERS | asynchronous)
    page.packages = frozenset(p for command in re.findall(r"^\$ pip install (.*)$", text_, re.M)
                              for p in shlex.split(command, comments=True) if not p.startswith("idem-dialects"))
    return page


PAGES = [read_page(p.stem if p.name == "README.md" else str(p.relative_to(DOCS)), p)
         for p in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]]
PAGES = [p for p in PAGES if p.steps]


def environment(extras: frozenset[str], built: Built, packages: frozenset[str] = frozenset()) -> Path:
    """A fresh venv with pip, the wheel and `extras` (and `packages` beside them), one per set for the run (a page's
    console block runs its own `pip install` line in it)."""
    name = "-".join(["examples", *sorted(extras), *sorted(packages)])
    return venv(built, name, f"{built.wheel}[{','.join(sorted(extras))}]", *sorted(packages), pip=True)


@dataclass(frozen=True)
class Target:
    name: str
    urls: dict[str, tuple[str, str]]  # the page's SQLite file or server URL -> (sync, async) URL standing for it


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The engine, with a fresh, empty database per SQLite file of the page on a server (created now, dropped
    after); SQLite keeps the page's own files."""
    name = request.param
    page: Page = request.getfixturevalue("page")
    if name == "sqlite" and page.name in ON_SERVER:
        pytest.skip(f"{page.name} runs on the servers only: {ON_SERVER[page.name][1]}")
    if name == "sqlite" and page.files and page.name != "README":
        # Sybil runs the page's blocks on SQLite (docs/conftest.py); the fresh environment and the second run are
        # proved here on the servers, with only the URL changed.
        pytest.skip(f"{page.name}: on SQLite under Sybil; in a fresh environment, twice, on the servers")
    if name == "sqlite":
        yield Target(name, {})
        return
    if not page.files:
        pytest.skip(f"{page.name} takes no database URL: it runs once, on SQLite")
    try:
        server = get(name).provide()
    except Unavailable as exc:
        pytest.skip(f"{name} unavailable: {exc}")
    admin = create_engine(server.url, isolation_level="AUTOCOMMIT")
    databases = {f: f"idem_examples_{secrets.token_hex(4)}" for f in page.files}
    async_driver = {"postgresql": "psycopg", "mariadb": "asyncmy"}[name]
    try:
        with admin.connect() as conn:
            for database in databases.values():
                conn.execute(text(f"CREATE DATABASE {database}"))
        urls = {}
        for f, database in databases.items():
            url = server.url.set(database=database)
            urls[f] = (url.render_as_string(hide_password=False), url.set(
                drivername=f"{url.get_backend_name()}+{async_driver}").render_as_string(hide_password=False))
        yield Target(name, urls)
    finally:
        with admin.connect() as conn:
            for database in databases.values():
                conn.execute(text(f"DROP DATABASE IF EXISTS {database}"))
        admin.dispose()
        server.stop()


def with_urls(steps: list[dict[str, object]], target: Target) -> list[dict[str, object]]:
    """The steps with each SQLite file's URL (or server URL: ON_SERVER) replaced by the target's (its async URL where
    the block's was aiosqlite): the only change a reader makes."""
    def replace(found: re.Match[str]) -> str:
        call, aio, file, _ = found.groups()
        if target.name == "sqlite":
            return found.group(0) if file else f"{call or ''}sqlite{'+aiosqlite' if call else ''}:///app.db"
        sync, asynchronous = target.urls[file or "app.db"]
        return (call or "") + (asynchronous if (aio if file else call) else sync)

    def replace_all(step: str) -> str:
        step = SQLITE_FILE.sub(replace, step)
        for printed, (sync, _) in target.urls.items():
            if "://" in printed:  # a server's URL the page prints (ON_SERVER)
                step = step.replace(printed, sync)
        return step

    return [json.loads(replace_all(json.dumps(step))) for step in steps]


@pytest.fixture(params=PAGES, ids=[p.name for p in PAGES])
def page(request: pytest.FixtureRequest) -> Page:
    page: Page = request.param
    reason = NOT_HERE.get(page.name)
    if reason:
        pytest.skip(f"{page.name}: {reason}")
    return page


def test_every_block_runs_twice_in_a_fresh_environment_with_the_pages_extras(page: Page, target: Target,
                                                                             built: Built, tmp_path: Path) -> None:
    home = environment(page.extras, built, page.packages)
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps(with_urls(page.steps, target)), encoding="utf-8")
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "VIRTUAL_ENV")}
    env["PATH"] = f"{home / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    for attempt in (1, 2):
        done = subprocess.run([str(home / "bin" / "python"), str(runner), str(steps)], cwd=work, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (f"{page.name}, run {attempt} on {target.name}, extras"
                                      f" [{','.join(sorted(page.extras))}]:\n{done.stderr[-4000:]}")
