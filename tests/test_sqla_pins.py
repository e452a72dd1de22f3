"""SQLAlchemy's private names: each one the library uses is in `idem_dialects.sqla.PINNED` and exists on the
installed SQLAlchemy (a release that moves one fails here, naming it), and no other library module reaches any."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from idem_dialects.sqla import PINNED

ROOT = Path(__file__).resolve().parent.parent
# The async adapters whose driver is not installed are skipped, with that reason.
DRIVERS = {"asyncpg": "asyncpg", "psycopg": "psycopg", "aiosqlite": "aiosqlite", "asyncmy": "asyncmy"}


def _class(where: str) -> type:
    module, _, name = where.rpartition(".")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def _has(cls: type, name: str) -> bool:
    if hasattr(cls, name) or any(name in getattr(base, "__slots__", ()) for base in cls.__mro__):
        return True
    if cls is Connection:  # an attribute its instances set when made
        with create_engine("sqlite://").connect() as conn:
            return hasattr(conn, name)
    return False


@pytest.mark.parametrize(("where", "name"), PINNED, ids=[f"{w.rpartition('.')[2]}.{n}" for w, n in PINNED])
def test_each_pinned_private_name_exists(where: str, name: str) -> None:
    for driver, module in DRIVERS.items():
        if f".{driver}." in where:
            pytest.importorskip(module, reason=f"{module} is not installed: its SQLAlchemy adapter is not checked")
    assert _has(_class(where), name), f"SQLAlchemy moved {where}.{name}: update idem_dialects/sqla.py"


def test_no_other_library_module_reaches_a_private_sqlalchemy_name() -> None:
    pinned = {name for _, name in PINNED}
    found = []
    for path in (ROOT / "idem_dialects").rglob("*.py"):
        if path.name == "sqla.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in pinned and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert found == [], "private SQLAlchemy names outside idem_dialects/sqla.py:\n" + "\n".join(found)
