"""How checks are named and what they record, without importing pytest: `idem-dialects matrix` reads these in
every CLI start-up, while the plugin that needs pytest is only loaded when the suite runs."""

from __future__ import annotations

from typing import Any

# Observations are pytest user properties (record_property) named with this prefix, so a JUnit XML report carries
# them too: <property name="idem_observation:server version" value="..."/>.
OBSERVATION_PREFIX = "idem_observation:"
# A plugin object with this attribute (e.g. the one `idem-dialects matrix` passes) maps engine names to the Server
# it already provisioned or the Unavailable it got; this session then uses those instead of provisioning its own
# (and leaves stopping them to their owner).
PROVISIONED = "idem_dialects_provisioned"


def observation_property(name: str) -> str:
    """The user-property name under which the observation `name` is recorded."""
    return OBSERVATION_PREFIX + name


def observation_name(prop: str) -> str | None:
    """The observation a user property records, or None for another plugin's property."""
    return prop.removeprefix(OBSERVATION_PREFIX) if prop.startswith(OBSERVATION_PREFIX) else None


def check_id(item: Any) -> tuple[str, str]:
    """(stable id, variant) of a collected check: the function name without ``test_``, and its parameter id without
    the engine ('' when not parametrized). The plugin parametrizes the engine first, so it leads the id."""
    name = getattr(item, "originalname", None) or item.name.partition("[")[0]
    ident = name.removeprefix("test_")
    variant = item.name[len(name):].removeprefix("[").removesuffix("]")
    callspec = getattr(item, "callspec", None)
    engine = callspec.params.get("idem_engine") if callspec is not None else None
    if isinstance(engine, str) and (variant == engine or variant.startswith(engine + "-")):
        variant = variant[len(engine) + 1:]
    return ident, variant


def check_statement(item: Any) -> str:
    """The guarantee a check proves: the first paragraph of its docstring, on one line."""
    doc = getattr(getattr(item, "obj", None), "__doc__", None) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())
