"""The conformance plugin is opt-in: installing idem-dialects adds nothing to an unrelated project's pytest run, and the
docs' recipe (the plugin, and the suite's one line) runs every check of the suite in a fresh project."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from idem_dialects.conformance import suite
from idem_dialects.features import Features

ROOT = Path(__file__).resolve().parent.parent
OPT_IN = 'pytest_plugins = ["idem_dialects.conformance.plugin"]\n'
SUITE = "from idem_dialects.conformance.suite import *  # noqa: F403\n"


def pytest_in(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest run in `project` as its own user would run it: no options or plugin settings of ours leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "IDEM_URL_"))}
    (project / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=project,
                          capture_output=True, text=True, env=env, timeout=300)


def test_installed_package_adds_no_fixtures(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text("def test_mine(store):\n    assert store\n", encoding="utf-8")
    done = pytest_in(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fixture 'store' not found" in done.stdout
    assert "idem_store" not in done.stdout  # not even listed among the available fixtures


def test_one_line_opt_in_runs_the_suite(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(OPT_IN, encoding="utf-8")
    (tmp_path / "test_conformance.py").write_text(SUITE, encoding="utf-8")
    (tmp_path / "test_mine.py").write_text("def test_mine(store):\n    assert store\n", encoding="utf-8")
    junit = tmp_path / "junit.xml"
    done = pytest_in(tmp_path, "test_conformance.py", "--idem-engine", "sqlite", f"--junitxml={junit}",
                     "-k", "first_request or key_column_declares_byte_exact_type")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    properties = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert properties.get("idem_observation:key column (declared DDL)"), properties  # record_property reached XML
    # The suite's fixtures are namespaced: the project's own `store` is still its own business.
    mine = pytest_in(tmp_path, "test_mine.py")
    assert mine.returncode == 1 and "fixture 'store' not found" in mine.stdout


def test_unknown_feature_is_a_collection_error(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(OPT_IN, encoding="utf-8")
    (tmp_path / "test_typo.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.idem_requires('no_such_feature')\n"
        "def test_typo(idem_store):\n"
        "    pass\n", encoding="utf-8")
    done = pytest_in(tmp_path, "--idem-engine", "sqlite")
    assert done.returncode == 2, done.stdout + done.stderr  # interrupted: errors during collection
    assert "ERROR collecting test_typo.py" in done.stdout
    known = ", ".join(sorted(Features.flags()))  # concurrent_connections, exclusive_claim, processes, ...
    assert f"unknown feature(s) 'no_such_feature'; known features: {known}" in done.stdout


def test_expected_failures_are_strict_xfails(tmp_path: Path) -> None:
    """A check a backend's Features list as expected to fail is a strict xfail there: passing it is reported."""
    (tmp_path / "conftest.py").write_text(
        OPT_IN
        + "from idem_dialects.dialects import register\n"
        "from idem_dialects.dialects.sqlite import SQLiteBackend\n\n"
        "class Known(SQLiteBackend):\n"
        "    base_features = SQLiteBackend.base_features.replace(\n"
        "        expected_failures=(('first_request_claims_and_runs_once', 'known to fail here'),))\n\n"
        "register('sqlite', Known)\n", encoding="utf-8")
    (tmp_path / "test_conformance.py").write_text(SUITE, encoding="utf-8")
    done = pytest_in(tmp_path, "--idem-engine", "sqlite", "-k", "first_request or retry_replays", "-rX")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout and "[XPASS(strict)] known to fail here" in done.stdout


def recipe() -> dict[str, str]:
    """The files of docs/conformance.md's recipe (a python block whose parts start ``# <path>``), by path."""
    page = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, re.DOTALL) if "# tests/conftest.py" in b)
    parts = re.split(r"^# (tests/\S+)\n", block, flags=re.MULTILINE)
    return {path: text.strip() for path, text in zip(parts[1::2], parts[2::2], strict=True)}


def test_the_docs_recipe_is_the_one_line() -> None:
    assert recipe() == {"tests/conftest.py": 'pytest_plugins = ["idem_dialects.conformance.plugin"]',
                        "tests/test_idem_conformance.py": SUITE.strip()}


def _async_only(name: str) -> bool:
    marks = getattr(getattr(suite, name), "pytestmark", [])
    return any(mark.name == "idem_api" and mark.args == ("async",) for mark in marks)


@pytest.mark.slow  # the whole suite on SQLite, in a fresh project
def test_a_fresh_project_runs_every_check_with_the_recipe(tmp_path: Path) -> None:
    """The docs' recipe, written into an empty project and run by pytest on SQLite: every check of the suite's list
    runs (the sync store's; the async-only ones are collected for the async store), none fails, each skip says why."""
    for path, text in recipe().items():
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(text + "\n", encoding="utf-8")
    junit = tmp_path / "junit.xml"
    done = pytest_in(tmp_path, "tests", "--idem-engine", "sqlite", f"--junitxml={junit}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    cases = list(ET.parse(junit).iter("testcase"))
    ran = {case.get("name", "").partition("[")[0] for case in cases}
    assert ran == {name for name in suite.__all__ if not _async_only(name)}
    assert all(skip.get("message") for skip in ET.parse(junit).iter("skipped"))
    collected = pytest_in(tmp_path, "tests", "--idem-engine", "sqlite", "--idem-api", "both", "--collect-only")
    assert collected.returncode == 0, collected.stdout[-4000:]
    ids = re.findall(r"::(test_\w+)\[", collected.stdout)
    assert set(ids) == set(suite.__all__)


def test_a_failed_check_says_its_server_exited(tmp_path: Path) -> None:
    """A check that fails on a server one of whose processes exited (a pooler, a node) says so beside its error: how
    it exited and its log's last lines, which go with the server's temp dir at the session's end."""
    (tmp_path / "conftest.py").write_text(
        OPT_IN
        + "from sqlalchemy import make_url\n"
        "from idem_dialects.engines import Server\n\n"
        "idem_dialects_provisioned = {'sqlite': Server('sqlite', make_url('sqlite://'), 'a stand-in',\n"
        "                                              gone=lambda: 'pgbouncer exited with -9: its last lines')}\n",
        encoding="utf-8")
    (tmp_path / "test_checks.py").write_text(
        "def test_fails(idem_engine):\n    assert False, 'the check failed'\n\n\n"
        "def test_passes(idem_engine):\n    pass\n", encoding="utf-8")
    done = pytest_in(tmp_path, "--idem-engine", "sqlite")
    assert done.returncode == 1 and "1 failed, 1 passed" in done.stdout, done.stdout + done.stderr
    assert done.stdout.count("idem-dialects: the server") == 1, done.stdout
    assert "pgbouncer exited with -9: its last lines" in done.stdout
