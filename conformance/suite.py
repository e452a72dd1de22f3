"""The conformance suite: every check a backend must pass, in the order they run. This module is the list.

A project runs all of them, as SQLAlchemy's third-party dialects run ``sqlalchemy.testing.suite``, with its
``conftest.py`` opting in to the plugin (``pytest_plugins = ["idem_dialects.conformance.plugin"]``) and one line in a
test module of its own::

    from idem_dialects.conformance.suite import *  # noqa: F403

`idem-dialects check` and `matrix` collect this module, and this project's tests/test_conformance.py is that line.
A check module is added to `MODULES` and nowhere else: tests/test_suite_list.py fails on a check (a ``test_*``
function) under conformance/ that this module does not export. `__all__` is the checks alone, so a star-import
brings no helper.

A check declares what it needs on its function, which is what travels with the import: the backend features
(``@pytest.mark.idem_requires("concurrent_connections")``), the one store it is about (``idem_api("sync")``), or
that it breaks its server (``idem_disruptive``). A check module never sets ``pytestmark``: a module's marks stay
with the module, which no run collects.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

# The check modules, in the order they run (the cluster checks last: they end by killing a node).
MODULES = (
    "test_protocol",
    "test_concurrency",
    "test_keys",
    "test_integrity",
    "test_retry",
    "test_isolation",
    "test_conflict",
    "test_schema_race",
    "test_outbox",
    "test_async",  # async columns only (--idem-api async|both)
    "test_async_cancel",  # async columns only
    "test_faults",
    "test_restart",
    "test_shards",  # two shards of the engine's server, one of them taken down
    "test_cluster",
)


def _checks() -> dict[str, Callable[..., Any]]:
    """Every module's checks by name, in run order. Not a star-import of each module: their helpers share names, and
    a check named twice would silently replace the first."""
    found: dict[str, Callable[..., Any]] = {}
    for name in MODULES:
        module = import_module(f"{__package__}.{name}")
        for ident, check in vars(module).items():
            if ident.startswith("test_") and callable(check) and check.__module__ == module.__name__:
                if ident in found:
                    raise ImportError(f"two conformance checks are named {ident}: in {found[ident].__module__} and"
                                      f" {module.__name__}")
                found[ident] = check
    return found


globals().update(_checks())
__all__ = [name for name in list(globals()) if name.startswith("test_")]
