"""Backend registry keyed by SQLAlchemy dialect name, open to third parties through an entry-point group.

A third-party package registers ``name = "module:Class"`` under the ``idem_dialects.backends`` entry-point group
(or calls `register` at import time); the class subclasses `idem_dialects.dialects.base.Backend`.
"""

from __future__ import annotations

import difflib
from importlib import import_module
from importlib.metadata import entry_points

from ..errors import UnsupportedEngine
from .base import Backend

ENTRY_POINT_GROUP = "idem_dialects.backends"

_registry: dict[str, str | type[Backend]] = {
    "sqlite": "idem_dialects.dialects.sqlite:SQLiteBackend",
    "postgresql": "idem_dialects.dialects.postgresql:PostgreSQLBackend",
    "mysql": "idem_dialects.dialects.mysql:MySQLBackend",
    "mariadb": "idem_dialects.dialects.mysql:MariaDBBackend",
    "mssql": "idem_dialects.dialects.mssql:MSSQLBackend",
    "oracle": "idem_dialects.dialects.oracle:OracleBackend",
}
_entry_points_loaded = False

def register(name: str, backend: str | type[Backend]) -> None:
    """Register a backend for a SQLAlchemy dialect name, as a class or a lazy "module:Class" reference."""
    _registry[name] = backend


def _load_entry_points() -> None:
    global _entry_points_loaded
    if not _entry_points_loaded:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            _registry.setdefault(ep.name, ep.value)
        _entry_points_loaded = True


def names() -> list[str]:
    _load_entry_points()
    return sorted(_registry)


def load(name: str) -> type[Backend]:
    """The backend class for a dialect name; its module (and so its driver) is imported only now."""
    _load_entry_points()
    target = _registry.get(name)
    if target is None:
        raise UnsupportedEngine(name, sorted(_registry), did_you_mean(name))
    if isinstance(target, str):
        module_name, _, attr = target.partition(":")
        target = getattr(import_module(module_name), attr)
        if not (isinstance(target, type) and issubclass(target, Backend)):
            raise TypeError(f"{_registry[name]!r} registered for {name!r} is not a Backend subclass")
        _registry[name] = target
    return target


def did_you_mean(name: str) -> str:
    """A hint for an unknown backend name: the backend it is an alias of, or the closest known name."""
    wanted = name.lower()
    guess = next((known for known in names() if wanted in _aliases(known)), None)
    guess = guess or next(iter(difflib.get_close_matches(wanted, names(), n=1)), None)
    return f"did you mean {guess}://?" if guess else ""


def _aliases(name: str) -> tuple[str, ...]:
    try:
        return load(name).aliases
    except Exception:  # a third-party backend that cannot load offers no aliases; the hint is best effort
        return ()


def install_hint(backend: str, driver: str) -> str:
    """How to install the driver a URL names: the driver's package (or the backend's extra for a driver it does not
    know), and any system library the driver needs that is missing here (e.g. unixODBC's libodbc.so.2)."""
    try:
        return load(backend).install_hint(driver)
    except UnsupportedEngine:
        return f"install the Python driver for {backend}+{driver}"
