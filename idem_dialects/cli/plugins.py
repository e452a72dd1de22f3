"""What other distributions add to the command: subcommands (entry-point group ``idem_dialects.commands``) and the
renderers of their reports (``idem_dialects.reports``), each imported only when used.

The benchmark harness is one: the ``idem-dialects-bench`` distribution (tools/bench in the repository) registers
``bench`` in both groups, so the runtime wheel carries none of it and `idem-dialects bench` works wherever it is
installed.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from ..errors import ConfigurationError

COMMAND_GROUP = "idem_dialects.commands"
REPORT_GROUP = "idem_dialects.reports"
# Each plugin the command names in its help, and what to install for it.
PROVIDERS = {"bench": "the idem-dialects-bench distribution (pip install -e tools/bench in a checkout of"
                      " idem-dialects)"}


class NotInstalled(ConfigurationError):
    """A plugin the command names is not installed; the message says what to install (one line)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"{name} is not installed here: it comes with {PROVIDERS[name]}")


def plugin(group: str, name: str) -> Any:
    """The module registered as `name` in `group`, imported now; NotInstalled when no distribution registers it."""
    found = list(entry_points(group=group, name=name))
    if not found:
        raise NotInstalled(name)
    return found[0].load()


def installed(group: str, name: str) -> bool:
    return bool(entry_points(group=group, name=name))
