"""What one run of the test command runs, read from its collection (nothing runs): each conformance check once per
engine, API and driver, from one module; beside its base engine a stack runs only the checks of what it adds, and
docs/development.md lists the others with why the base engine's run covers them; one test module builds the docs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import test_conformance

from idem_dialects.engines import ENGINES

ROOT = Path(__file__).resolve().parent.parent
# CI's engines (.ci/run requires each of them).
CI_ENGINES = ["sqlite", "postgresql-18", "postgresql", "mariadb", "postgresql-patroni", "pgbouncer-transaction",
              "galera-haproxy"]
CHECKS = {name: check for name, check in vars(test_conformance).items() if name.startswith("test_")}


def _stack_check(name: str) -> bool:
    return any(mark.name == "idem_stack" for mark in getattr(CHECKS[name], "pytestmark", []))


@pytest.fixture(scope="module")
def collected() -> list[str]:
    """The node ids of the test command's pytest run with CI's engines, collected in a process of its own."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    args = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    for name in CI_ENGINES:
        args += ["--idem-require", name]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def readme_command(name: str) -> list[str]:
    """The arguments of README's pytest command between its <!-- NAME --> markers (after `.venv/bin/pytest`)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(rf"<!-- {name} -->\n```\n(.*?)\n```\n<!-- /{name} -->", readme, re.S)
    assert found, f"README has no {name} block"
    return shlex.split(found.group(1).rpartition(".venv/bin/pytest")[2])


def _column(nodeid: str) -> tuple[str, str]:
    """(check function, parameter id) of a node id."""
    name, _, params = nodeid.partition("::")[2].partition("[")
    return name, params.rstrip("]")


@pytest.mark.slow  # collects the whole suite
def test_each_check_runs_once_per_engine_api_and_driver(collected: list[str]) -> None:
    runs = Counter(_column(n) for n in collected if n.startswith("tests/test_conformance.py::"))
    assert runs and [run for run, count in runs.items() if count > 1] == []
    # Only tests/test_conformance.py brings the checks into a test module (a helper may be imported elsewhere).
    importers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if re.search(
        r"^from idem_dialects\.conformance\.[\w.]+ import (\*|.*\btest_)", p.read_text(encoding="utf-8"), re.M))
    assert importers == ["tests/test_conformance.py"]


@pytest.mark.slow  # the same collection
def test_stacks_beside_their_base_run_only_the_checks_of_what_they_add(collected: list[str]) -> None:
    stacks = [name for name in ENGINES if ENGINES[name].stacked_on is not None]
    on_stacks = {_column(n)[0] for n in collected if _column(n)[0] in CHECKS
                 and any(_column(n)[1].startswith(stack) for stack in stacks)}
    assert on_stacks and {name for name in on_stacks if not _stack_check(name)} == set()
    # Each stack still runs every one of them that its API allows (none skipped by the selection).
    assert on_stacks == {name for name in CHECKS if _stack_check(name)}


def test_development_page_lists_every_check_the_stacks_leave_to_their_base_engine() -> None:
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    found = re.search(r"^### What the stacks leave to their base engine\n(.*?)^#", page, re.S | re.M)
    assert found, "docs/development.md has no section 'What the stacks leave to their base engine'"
    table = "\n".join(line.split(" | ")[0] for line in found.group(1).splitlines() if line.startswith("| `"))
    listed = set(re.findall(r"`([a-z0-9_]+)`", table))
    assert listed == {name.removeprefix("test_") for name in CHECKS if not _stack_check(name)}


@pytest.mark.slow  # collects the quick run's suite
def test_the_quick_command_runs_the_suite_on_sqlite_and_builds_nothing() -> None:
    """README's quick command, collected: the conformance checks on SQLite's columns only, no wheel or site build."""
    args = readme_command("quick-command")
    assert args[:2] == ["-n", "3"] and "--idem-engine" in args
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *args[4:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    columns = {_column(n)[1].split("-")[0] for n in ids if n.startswith("tests/test_conformance.py::")}
    assert columns == {"sqlite"}
    assert not [n for n in ids if n.startswith(("tests/test_wheel.py", "tests/test_docs.py"))]


def test_one_test_module_builds_the_documentation() -> None:
    """Sphinx runs in one place, the session's `site` fixture (tests/wheel_common.py); every test that reads the
    built site takes that fixture."""
    builders = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
                      if re.search(r'"-m",\s*"sphinx"', p.read_text(encoding="utf-8")))
    assert builders == ["tests/wheel_common.py"]


def test_workers_get_the_scopes_heaviest_first_and_shared_servers_stay_together() -> None:
    """What a pytest-xdist worker runs together (conftest.scope_of), and in which order the scopes go out: a stack's
    checks together (it starts once), other conformance checks one by one, a page's examples on every engine
    together, the mistakes' tests by function; a scope with a test marked slow before one of many quick tests."""
    from conftest import SLOW_WEIGHT, pytest_collection_modifyitems, scope_of

    examples = "tests/test_examples.py::test_every_block[operations/purge.md-{}]"
    assert {scope_of(examples.format(e)) for e in ("sqlite", "postgresql", "mariadb")} == \
        {"tests/test_examples.py::test_every_block[operations/purge.md"}
    assert scope_of("tests/test_conformance.py::test_replay[galera-haproxy-all-writers-sync]") == \
        "galera-haproxy-all-writers"
    assert scope_of("tests/test_conformance.py::test_replay[galera-haproxy-single-writer-async-asyncmy]") == \
        "galera-haproxy-single-writer"
    assert scope_of("tests/test_conformance.py::test_replay[sqlite-sync]") == \
        "tests/test_conformance.py::test_replay[sqlite-sync]"
    assert scope_of("tests/test_mistakes.py::test_every_command[unknown host]") == \
        "tests/test_mistakes.py::test_every_command"
    assert scope_of("tests/test_cli.py::test_stats[sqlite]") == "tests/test_cli.py"
    # Handed out heaviest first: the slow test's module, then the module of three quick tests, then the check; within
    # a scope the tests keep their order.
    items = [Item("tests/test_conformance.py::test_replay[sqlite-sync]"), Item("tests/test_cli.py::test_a"),
             Item("tests/test_oldest.py::test_suite", slow=True), Item("tests/test_cli.py::test_b"),
             Item("tests/test_cli.py::test_c")]
    pytest_collection_modifyitems(Worker(), items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["tests/test_oldest.py::test_suite", "tests/test_cli.py::test_a",
                                         "tests/test_cli.py::test_b", "tests/test_cli.py::test_c",
                                         "tests/test_conformance.py::test_replay[sqlite-sync]"]
    assert SLOW_WEIGHT > 3


class Item:
    def __init__(self, nodeid: str, slow: bool = False) -> None:
        self.nodeid, self.slow = nodeid, slow

    def get_closest_marker(self, name: str) -> object:
        return object() if name == "slow" and self.slow else None


class Worker:
    workerinput: dict[str, str] = {}  # what tells a pytest-xdist worker's config
