"""Every parameter of the API reference has a description, and one description per meaning.

Many parameters recur across the API (`scope`, `operation`, `key`, `request` on both stores, the HTTP layer and the
adapters): each is described once in `parameters.toml`, beside this file, and added as a ``:param:`` field to every
documented function, method or class whose docstring does not describe it itself (``Args:`` or ``:param:``). An
entry ``Owner.name`` (a class or function name) wins over a bare ``name`` for that owner. A parameter that has no
description either way is a warning, so the build (warnings as errors) fails: a new parameter must be described.
A dataclass field documented by its own attribute docstring counts as described, and one with a ``doc`` in its
metadata (`Features`) is described by it.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging

logger = logging.getLogger(__name__)
GLOSSARY: dict[str, str] = tomllib.loads((Path(__file__).with_name("parameters.toml")).read_text(encoding="utf-8"))
_FIELD = re.compile(r":param\s+(?:[^:]*\s)?\*{0,2}(\w+)\s*:")
_SKIPPED = {"self", "cls"}


def _signature(obj: Any, what: str) -> tuple[str, inspect.Signature] | None:
    """(owner name, the signature whose parameters a reader passes) of a documented object, or None."""
    if what in ("class", "exception"):
        if isinstance(obj, enum.EnumMeta):  # members, not constructor arguments
            return None
        init = obj.__dict__.get("__init__") or next(
            (c.__dict__["__init__"] for c in obj.__mro__[1:] if "__init__" in c.__dict__ and c is not object
             and not c.__module__.startswith("builtins")), None)
        if init is None:
            return None
        try:
            return obj.__name__, inspect.signature(init)
        except (TypeError, ValueError):
            return None
    if what in ("function", "method", "decorator"):
        try:
            return obj.__name__, inspect.signature(obj)
        except (TypeError, ValueError):
            return None
    return None


def _attribute_docs(obj: Any) -> set[str]:
    """The attributes of class `obj` documented by an attribute docstring (``field: T`` then ``\"\"\"...\"\"\"``)."""
    documented: set[str] = set()
    for cls in getattr(obj, "__mro__", ())[:-1]:
        try:
            found = ModuleAnalyzer.for_module(cls.__module__).find_attr_docs()
        except Exception:  # a class made at run time, or a module without source
            continue
        documented |= {attr for (owner, attr), lines in found.items() if owner == cls.__qualname__ and any(lines)}
    return documented


def describe(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    if not name.startswith("idem_dialects"):
        return
    if what == "class" and getattr(obj, "_is_protocol", False):
        return  # a typing.Protocol is a surface to implement, never constructed: its members carry the parameters
    found = _signature(obj, what)
    if found is None:
        return
    owner, signature = found
    qualified = getattr(obj, "__qualname__", owner)  # Class.method, for an entry of one method
    described = {m.group(1) for line in lines for m in _FIELD.finditer(line)}
    added: list[str] = []
    if what in ("class", "exception"):
        described |= _attribute_docs(obj)
        if dataclasses.is_dataclass(obj):  # a field described by its own metadata (Features' flags)
            for field in dataclasses.fields(obj):
                if field.name not in described and field.metadata.get("doc"):
                    described.add(field.name)
                    added.append(f":param {field.name}: {field.metadata['doc']}")
    for param in signature.parameters.values():
        if param.name in _SKIPPED or param.name.startswith("_") or param.name in described:
            continue
        if param.kind is param.VAR_POSITIONAL and param.name == "args":
            continue
        text = next((GLOSSARY[k] for k in (f"{qualified}.{param.name}", f"{owner}.{param.name}", param.name)
                     if k in GLOSSARY), None)
        if text is None:
            logger.warning("parameter %r of %s has no description: add it to its docstring or to"
                           " docs/_ext/parameters.toml", param.name, name, type="idem", subtype="parameter")
            continue
        added.append(f":param {param.name}: {text}")
    if added:
        if lines and lines[-1].strip():
            lines.append("")
        lines.extend(added)


def setup(app: Sphinx) -> dict[str, Any]:
    handler: Callable[..., None] = describe
    app.connect("autodoc-process-docstring", handler, priority=600)  # after napoleon (500) made its fields
    return {"parallel_read_safe": True, "parallel_write_safe": True}
