"""docs/development.md is the map a contributor reads first: it names every module of the library (its Layout tree)
and every member an engine's author sets, overrides or calls (Adding an engine, Adding a driver). A module or a
member added without the page, or a page naming a module that is gone, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from contract_common import own_members

from idem_dialects.conformance import suite
from idem_dialects.dialects.base import Backend
from idem_dialects.dialects.classify import ErrorClassifier
from idem_dialects.dialects.maintenance import Maintenance
from idem_dialects.drivers import Driver

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
LIBRARY = ("idem_dialects", "engines", "conformance")  # the folders installed as the library's three packages
DESCRIPTION = 24  # the Layout tree's second column: a line whose first word (a folder) starts before it names one


def section(title: str) -> str:
    return PAGE.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def layout() -> dict[str, str]:
    """The Layout tree's text under each folder (its line, and the lines after it up to the next folder), by path."""
    tree = section("Layout").split("```\n", 2)[1]
    spans: dict[str, str] = {}
    parents: list[tuple[int, str]] = []
    for line in tree.splitlines():
        folder = re.match(rf"( {{0,{DESCRIPTION - 2}}})(\S+/)(?:\s|$)", line)
        if folder is None:
            spans[parents[-1][1]] += "\n" + line
            continue
        indent = len(folder.group(1))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = (parents[-1][1] if parents else "") + folder.group(2)
        parents.append((indent, path))
        spans[path] = line[folder.end():]
    return spans


def named(text: str) -> set[str]:
    """The module files a text names (`name.py`, not part of a longer path such as tests/test_layering.py)."""
    return set(re.findall(r"(?<![\w/.])(\w+\.py)\b", text))


def library_folders() -> dict[str, set[str]]:
    """Each library folder holding a module (its __init__.py aside), by path as the tree spells it, and its modules.
    The check modules (conformance/test_*.py) are the suite's list (conformance/suite.py), not repeated here."""
    folders: dict[str, set[str]] = {}
    for top in LIBRARY:
        for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            modules = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
            if top == "conformance":
                modules -= {f"{name}.py" for name in suite.MODULES}
            if modules:
                folders[f"{folder.relative_to(ROOT)}/"] = modules
    return folders


def test_the_layout_names_every_module_of_the_library() -> None:
    spans, folders = layout(), library_folders()
    missing = {path: sorted(modules - named(spans.get(path, ""))) for path, modules in folders.items()}
    assert {path: names for path, names in missing.items() if names} == {}, "modules the Layout tree does not name"
    for path, text in spans.items():
        if path.startswith(tuple(f"{top}/" for top in LIBRARY)):
            assert (ROOT / path).is_dir(), f"the Layout tree names a folder that is gone: {path}"
            gone = sorted(name for name in named(text) if not (ROOT / path / name).is_file())
            assert gone == [], f"the Layout tree names modules {path} does not hold: {gone}"


def test_the_layout_tree_is_read_as_written() -> None:
    spans = layout()
    assert "pysqlite.py" in named(spans["idem_dialects/drivers/"])
    assert "idem_purge.py" in named(spans["idem_dialects/django/management/commands/"])
    assert "test_layering.py" not in named(spans["idem_dialects/"])  # a path elsewhere, not a module here


def backticked(text: str) -> set[str]:
    """Every identifier inside `code` spans: `now_plus(seconds)` names now_plus, `Features.max_statement_bytes` both."""
    return {word for span in re.findall(r"`([^`]+)`", text) for word in re.findall(r"\w+", span)}


@pytest.mark.parametrize(("cls", "title"), [(Backend, "Adding an engine"), (ErrorClassifier, "Adding an engine"),
                                             (Maintenance, "Adding an engine"), (Driver, "Adding a driver")],
                         ids=lambda value: getattr(value, "__name__", None))
def test_the_page_names_every_member_an_author_sets_overrides_or_calls(cls: type, title: str) -> None:
    missing = sorted(set(own_members(cls)) - backticked(section(title)))
    assert missing == [], f"{cls.__name__} members that docs/development.md ({title}) does not name"
