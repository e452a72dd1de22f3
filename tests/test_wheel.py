"""A user's first install: the wheel and sdist as `python -m build` makes them, installed into fresh virtual
environments with no extras and with each extra alone, as the package index would hand them out.

The base install imports, prints `--help` and runs the SQLite demo without greenlet (SQLAlchemy 2.1 no longer
installs it) or any driver; each extra alone makes its modules importable, and where its engine runs here a store
round trip passes on its driver; the [conformance] extra's installed command runs `idem-dialects check` once, on
SQLite (the suite itself runs on every engine in tests/test_conformance.py). Installs come from a wheelhouse
downloaded once from the package index (pip's cache makes that cheap), so each venv installs offline; the build and
the wheelhouse are the session's (tests/wheel_common.py), shared with the documentation site's build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest
from sqlalchemy.engine import URL
from wheel_common import MODULES, Built, run, venv_env
from wheel_common import venv as make_venv

from idem_dialects import engines

pytestmark = pytest.mark.slow

# Development tools: no runtime extra may bring one (`conformance` runs on pytest, `docs` is Sphinx: those only).
DEV_TOOLS = {"pytest", "pytest-xdist", "ruff", "mypy", "sphinx", "zizmor", "sybil", "pytest-django", "django-stubs",
             "twine", "check-wheel-contents", "build"}
ALLOWED_TOOLS = {"conformance": {"pytest"}, "docs": {"sphinx"}, "all": {"pytest"}}
# Async round trips per async driver extra: (engine of live_urls or "sqlite", driver).
ASYNC_ENGINES = {"asyncpg": ("postgresql", "asyncpg"), "aiosqlite": ("sqlite", "aiosqlite"),
                 "asyncmy": ("mariadb", "asyncmy")}
# Modules the base install must not load on `import idem_dialects` / `import idem_dialects.http`: SQLAlchemy's asyncio
# layer needs greenlet, and the workshop (CLI, bench, reporting, catalogue, suite) is not the library.
NOT_LOADED = ("sqlalchemy.ext.asyncio", "greenlet", "idem_dialects.aio", "idem_dialects.cli", "idem_dialects.engines",
              "idem_dialects.conformance", "pytest", "jinja2")

IMPORT_PROBE = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        found[name] = "ok"
    except ModuleNotFoundError as exc:
        found[name] = f"missing: {exc}"
    except ImportError as exc:  # installed, but a system library it loads is not (pyodbc without unixODBC)
        found[name] = f"system library: {exc}"
print(json.dumps(found))
"""
ROUND_TRIP = """
import sys
from idem_dialects import IdempotencyStore
with IdempotencyStore.from_url(sys.argv[1], table_prefix=sys.argv[2]) as store:
    store.create_tables()
    try:
        first = store.run(scope="s", operation="op", key="k", request={"a": 1}, effect=lambda conn: {"n": 1})
        again = store.run(scope="s", operation="op", key="k", request={"a": 1}, effect=lambda conn: {"n": 2})
        assert (first.replayed, again.replayed, again.response) == (False, True, {"n": 1}), (first, again)
    finally:
        store.drop_tables()
print("round trip ok")
"""
ASYNC_ROUND_TRIP = """
import asyncio, sys
from idem_dialects import AsyncIdempotencyStore

async def effect(conn):
    return {"n": 1}

async def main():
    async with AsyncIdempotencyStore.from_url(sys.argv[1], table_prefix=sys.argv[2]) as store:
        await store.create_tables()
        try:
            first = await store.run(scope="s", operation="op", key="k", request={}, effect=effect)
            again = await store.run(scope="s", operation="op", key="k", request={}, effect=effect)
            assert (first.replayed, again.replayed) == (False, True)
        finally:
            await store.drop_tables()

asyncio.run(main())
print("async round trip ok")
"""


def _imports(venv: Path, built: Built, modules: tuple[str, ...]) -> dict[str, str]:
    done = run([venv / "bin" / "python", "-c", IMPORT_PROBE, *modules], cwd=built.workdir, env=venv_env(venv))
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def live_urls() -> Iterator[dict[str, URL]]:
    """The URLs of the servers this machine runs (PostgreSQL 15, MariaDB), each skipped with its reason if absent."""
    urls: dict[str, URL] = {}
    servers = []
    for name in ("postgresql", "mariadb"):
        try:
            server = engines.get(name).provide()
        except engines.Unavailable as exc:
            urls[name] = URL.create("unavailable", database=str(exc))
            continue
        servers.append(server)
        urls[name] = server.url
    yield urls
    for server in servers:
        server.stop()


def _live(urls: dict[str, URL], name: str) -> str:
    url = urls[name]
    if url.drivername == "unavailable":
        pytest.skip(f"{name} unavailable: {url.database}")
    return url.render_as_string(hide_password=False)


def test_metadata_is_what_the_index_shows(built: Built) -> None:
    """The wheel declares the license with its file, classifiers, project URLs and every extra; the README it
    carries links nowhere relative (the index has no repository beside it)."""
    with zipfile.ZipFile(built.wheel) as whl:
        meta_name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(whl.read(meta_name).decode())
        names = whl.namelist()
    assert meta["License-Expression"] == "MIT"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "Typing :: Typed" in meta.get_all("Classifier", [])
    assert "idem_dialects/py.typed" in names
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL", []))
    assert {"Homepage", "Source", "Issues", "Documentation"} <= set(urls)
    extras = set(meta.get_all("Provides-Extra", [])) - {"all", "dev"}
    assert extras == set(MODULES), "every extra has its modules listed in MODULES (and no more)"
    body = meta.get_payload()
    assert isinstance(body, str) and "idem-dialects" in body
    relative = [t for t in re.findall(r"\]\(([^)\s]+)\)", body) if not re.match(r"https?://|#", t)]
    assert relative == [], f"relative links break on the index page: {relative}"


def test_base_install_imports_helps_and_runs_the_demo(built: Built) -> None:
    """No extras: `import idem_dialects`, `idem-dialects --help` and `idem-dialects demo` exit 0, and importing the
    library (HTTP layer included) loads neither SQLAlchemy's asyncio layer nor the workshop."""
    venv = make_venv(built, "", str(built.wheel))
    env = venv_env(venv)
    probe = ("import sys, idem_dialects, idem_dialects.http; print(' '.join(m for m in sys.argv[1:]"
             " if m in sys.modules or any(k.startswith(m + '.') for k in sys.modules)))")
    loaded = run([venv / "bin" / "python", "-c", probe, *NOT_LOADED], cwd=built.workdir, env=env)
    assert loaded.stdout.strip() == "", f"import idem_dialects loaded {loaded.stdout.strip()}"
    absent = _imports(venv, built, ("greenlet", "jinja2"))
    assert absent["greenlet"].startswith("missing"), "greenlet came without [async]"
    assert absent["jinja2"].startswith("missing"), "jinja2 came without [report]"
    helped = run([venv / "bin" / "idem-dialects", "--help"], cwd=built.workdir, env=env)
    assert "demo" in helped.stdout and "check" in helped.stdout
    demo = run([venv / "bin" / "idem-dialects", "demo"], cwd=built.workdir, env=env)
    assert "credited once" in demo.stdout
    # The benchmark harness is a distribution of its own (tools/bench): without it, one line says what to install.
    bench = subprocess.run([venv / "bin" / "idem-dialects", "bench", "sqlite"], cwd=built.workdir, env=env,
                           capture_output=True, text=True, timeout=120)
    assert bench.returncode == 78 and len(bench.stderr.splitlines()) == 1 and "idem-dialects-bench" in bench.stderr


@pytest.mark.parametrize("extra", list(MODULES))
def test_each_extra_alone(built: Built, extra: str, live_urls: dict[str, URL], tmp_path: Path) -> None:
    """One extra alone: its modules import, the CLI and the demo still run, and where its engine runs here a store
    round trip passes on the installed driver (sync and, for [async], each async driver)."""
    venv = make_venv(built, extra, f"{built.wheel}[{extra}]")
    env = venv_env(venv)
    found = _imports(venv, built, MODULES[extra])
    assert not [m for m, how in found.items() if how.startswith("missing")], found
    for module, how in found.items():  # only a system library may be absent (say, unixODBC for pyodbc)
        assert how == "ok" or ".so" in how, (module, how)
    run([venv / "bin" / "idem-dialects", "--help"], cwd=built.workdir, env=env)
    run([venv / "bin" / "idem-dialects", "demo"], cwd=built.workdir, env=env)
    python = venv / "bin" / "python"
    prefix = f"w{os.getpid() % 10000}{extra[:3]}_"
    if extra == "postgresql":
        run([python, "-c", ROUND_TRIP, _live(live_urls, "postgresql"), prefix], cwd=built.workdir, env=env)
        both = make_venv(built, "postgresql-async", f"{built.wheel}[postgresql,async]")
        backend, _, rest = _live(live_urls, "postgresql").partition("://")
        run([both / "bin" / "python", "-c", ASYNC_ROUND_TRIP, f"postgresql+psycopg://{rest}", prefix],
             cwd=built.workdir, env=venv_env(both))
    elif extra == "mysql":
        run([python, "-c", ROUND_TRIP, _live(live_urls, "mariadb"), prefix], cwd=built.workdir, env=env)
    elif extra == "conformance":  # the suite through the installed command, once: on SQLite, needing no server
        done = run([venv / "bin" / "idem-dialects", "check", f"sqlite:///{tmp_path / 'check.db'}", "--quiet"],
                   cwd=built.workdir, env=env, timeout=900)
        assert " 0 failed" in done.stdout + done.stderr and "exit status 0" in done.stdout + done.stderr, \
            (done.stdout + done.stderr)[-2000:]
    elif extra in ASYNC_ENGINES:
        name, driver = ASYNC_ENGINES[extra]
        if name == "sqlite":
            url = f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"
        else:
            backend, _, rest = _live(live_urls, name).partition("://")
            url = f"{backend.split('+')[0]}+{driver}://{rest}"
        run([python, "-c", ASYNC_ROUND_TRIP, url, prefix], cwd=built.workdir, env=env)


@pytest.mark.parametrize("extra", [*MODULES, "all"])
def test_runtime_extras_bring_no_development_tools(built: Built, extra: str, tmp_path: Path) -> None:
    """What pip resolves for an extra (a fresh install, from the wheelhouse) holds no development tool: `[django]`
    brings Django, not pytest, ruff, mypy or Sphinx. Only `conformance` (and `all`, which includes it) brings pytest,
    which `check` and `matrix` run on, and only `docs` Sphinx."""
    report = tmp_path / "report.json"
    run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", "--no-index",
          "--find-links", built.wheelhouse, "--report", report, f"{built.wheel}[{extra}]"], cwd=built.workdir)
    resolved = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert resolved & DEV_TOOLS <= ALLOWED_TOOLS.get(extra, set()), sorted(resolved & DEV_TOOLS)


def test_docs_build_with_exactly_the_publishing_extras(site: Path) -> None:
    """The site builds as .readthedocs.yaml configures it (the session's `site`: a fresh venv with the wheel and
    exactly the extras that file names, warnings as errors), and its API reference holds every public name."""
    from test_docs import PUBLIC_MODULES, inventory, public_names

    missing = [name for name in public_names(PUBLIC_MODULES) if name not in inventory(site)]
    assert missing == [], missing


def test_sdist_carries_the_docs_and_the_examples(built: Built) -> None:
    """The source distribution holds the documentation's sources and the example applications (MANIFEST.in), and
    the wheel neither."""
    import tarfile

    with tarfile.open(built.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for needed in ("docs/conf.py", "docs/index.md", "docs/getting-started.md", "docs/_ext/parameters.py",
                   "docs/_ext/parameters.toml", "BENCHMARKS.md", "examples/flask_sqlite.py",
                   "examples/fastapi_postgres.py", "examples/django_postgres/manage.py"):
        assert needed in names, needed
    assert not [n for n in names if "__pycache__" in n]
    with zipfile.ZipFile(built.wheel) as whl:
        assert not [n for n in whl.namelist() if n.startswith(("docs/", "examples/"))]
        assert not [n for n in whl.namelist() if "bench" in n], "the benchmark harness is tools/bench, not the wheel"
