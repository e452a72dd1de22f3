"""Backend registry keyed by SQLAlchemy dialect name, open to third parties through an entry-point group.

A third-party package registers ``name = "module:Class"`` under the ``idem_dialects.backends`` entry-point group
(or calls `register` at import time); the class subclasses `idem_dialects.dialects.base.Backend` and defines its
required members (docs: Development, adding an engine).
"""

from __future__ import annotations

import difflib
import inspect
from importlib import import_module
from importlib.metadata import entry_points

from ..drivers import Driver
from ..errors import ConfigurationError, UnsupportedEngine
from .base import REQUIRED, Backend

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
    """The backend class for a dialect name; its module (and so its drivers' modules) imported only now. A class
    that is not a Backend, or misses a required member, is refused naming what it lacks."""
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
    missing = missing_members(target)
    if missing:
        raise ConfigurationError(f"the backend {target.__module__}.{target.__qualname__} registered for {name!r} does"
                                 f" not define the required members {', '.join(missing)} (see Backend's docstring)")
    return target


def missing_members(backend: type[Backend]) -> list[str]:
    """The required members of the contract `backend` leaves undefined."""
    missing = [name for name in REQUIRED if not hasattr(backend, name)]
    abstract: frozenset[str] = getattr(backend, "__abstractmethods__", frozenset()) if inspect.isabstract(
        backend) else frozenset()
    return missing + sorted(abstract - set(missing))


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


def driver(backend: type[Backend], name: str) -> Driver | None:
    """The driver a URL names (``<backend>+<name>``), if `backend` knows it."""
    return next((d for d in backend.drivers if d.name == name), None)


def usable_drivers(backend: type[Backend], asynchronous: bool = False) -> tuple[str, ...]:
    """The drivers of one kind that can be imported here (installed, their system libraries present)."""
    return tuple(d.name for d in backend.drivers
                 if (d.asynchronous if asynchronous else d.sync) and d.problem() is None)


def async_drivers(backend: type[Backend]) -> tuple[str, ...]:
    """The drivers AsyncIdempotencyStore can use on `backend` (create_async_engine), preferred first."""
    return tuple(d.name for d in backend.drivers if d.asynchronous)


def install_hint(backend: str, name: str) -> str:
    """How to install the driver a URL names: the driver's package (or the backend's first driver's package for a
    driver it does not know), and any system library the driver needs that is missing here; then, where a library is
    missing, a driver of the same kind that pip alone installs (no system library)."""
    try:
        cls = load(backend)
    except UnsupportedEngine:
        return f"install the Python driver for {backend}+{name}"
    known = driver(cls, name)
    if known is None:
        ours = [d.package for d in cls.drivers if d.sync and d.package and d.package.startswith("idem-dialects")]
        package = ours[0] if ours else None
        return f"pip install '{package}'" if package else f"install the Python driver for {cls.name}+{name}"
    hint = known.install_hint()
    if known.missing_libraries():
        alternative = next((d for d in cls.drivers if not d.libraries and d.package is not None
                            and ((known.sync and d.sync) or (known.asynchronous and d.asynchronous))), None)
        if alternative is not None:
            hint += (f"; or, with pip only: pip install '{alternative.package}' and use"
                     f" {cls.name}+{alternative.name}:// URLs")
    return hint
