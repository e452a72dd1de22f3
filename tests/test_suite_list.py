"""The conformance checks are one list, `idem_dialects.conformance.suite`: a check defined anywhere else in the library
fails here; `idem-dialects check` and `matrix` collect exactly it; this project's tests/test_conformance.py is its one
line (a fresh project running the docs' recipe, that line too, is tests/test_opt_in.py)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url

from idem_dialects.cli.commands.matrix import api_columns
from idem_dialects.conformance import suite
from idem_dialects.conformance.results import Collector, run_suite
from idem_dialects.engines import provision

ROOT = Path(__file__).resolve().parent.parent
# Where the library's modules live, and the package each folder is installed as (setuptools' package-dir).
PACKAGES = {"idem_dialects": "idem_dialects", "engines": "idem_dialects.engines",
            "conformance": "idem_dialects.conformance"}


def library_modules() -> Iterator[tuple[str, Path]]:
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            yield ".".join((package, *parts)).removesuffix(".__init__"), path


def top_level(path: Path) -> list[ast.stmt]:
    return ast.parse(path.read_text(encoding="utf-8")).body


def listed() -> set[tuple[str, str]]:
    return {(getattr(suite, name).__module__, name) for name in suite.__all__}


def test_every_check_in_the_library_is_in_the_suite() -> None:
    """A ``test_*`` function anywhere in the library is a check; the suite's list must run it."""
    defined = {(module, node.name) for module, path in library_modules() for node in top_level(path)
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")}
    missing = sorted(defined - listed())
    assert not missing, (f"checks the conformance suite does not run: {missing}; add their module to"
                         " idem_dialects.conformance.suite.MODULES (conformance/suite.py), the one list of checks")
    assert listed() <= defined


def _fixture(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute | ast.Name) and (
        target.attr if isinstance(target, ast.Attribute) else target.id) == "fixture"


def test_check_modules_hold_nothing_the_suite_would_drop() -> None:
    """The suite exports checks alone: a fixture or a module-level ``pytestmark`` in a check module would never reach
    the run (fixtures belong in the plugin; a check's marks go on its function)."""
    for name in suite.MODULES:
        for node in top_level(ROOT / "conformance" / f"{name}.py"):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                assert "pytestmark" not in {t.id for t in targets if isinstance(t, ast.Name)}, name
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert not any(map(_fixture, node.decorator_list)), f"{name}.{node.name}: a fixture in a check module"


def test_nothing_imports_the_check_modules_for_their_checks() -> None:
    """No second list: no test, tool or page star-imports a check module; they import the suite."""
    star = re.compile(r"^\s*(?:%\s*)?from idem_dialects\.conformance\.(test_\w+) import \*", re.MULTILINE)
    found = []
    for path in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("tools/**/*.py"), *ROOT.glob("docs/**/*.md"),
                 *ROOT.glob("examples/**/*.py"), ROOT / "README.md"]:
        found += [f"{path.relative_to(ROOT)}: {m}" for m in star.findall(path.read_text(encoding="utf-8"))]
    assert found == []
    own = [node for node in top_level(ROOT / "tests" / "test_conformance.py") if not isinstance(node, ast.Expr)]
    assert [ast.unparse(node) for node in own] == ["from idem_dialects.conformance.suite import *"]


class _AllCollected(Collector):
    """The checks the CLI's run collected, before its -k deselected all but one."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        self.collected = {item.originalname for item in items}


def test_check_and_matrix_collect_the_suite(tmp_path: Path) -> None:
    url = make_url(f"sqlite:///{tmp_path / 'cli.db'}")
    statuses = {"cli": provision("cli", {"cli": url}, required=True)}
    collector = _AllCollected(api_columns(statuses, "both"), None, engines=statuses)
    code = run_suite(["cli"], {"cli": url}, collector, "first_request_claims_and_runs_once", api="both")
    assert code == 0
    assert collector.collected == set(suite.__all__)
    assert [c.module for c in collector.checks.values()] == ["idem_dialects.conformance.test_protocol"]
