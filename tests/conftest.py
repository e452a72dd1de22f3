"""The project's own tests opt in to the shipped conformance plugin, exactly as a third-party project would."""

from collections.abc import Iterator
from typing import Any

import pytest

from idem_dialects import engines

pytest_plugins = ["idem_dialects.conformance.plugin"]


@pytest.hookimpl(tryfirst=True)  # before the plugin's own pytest_configure reads the option
def pytest_configure(config: Any) -> None:
    """The project proves both stores: the conformance suite runs on the sync and the async store unless the command
    line picks one (``--idem-api sync``); a third party's suite keeps the plugin's default (sync)."""
    if getattr(config.option, "idem_api", "unset") is None:
        config.option.idem_api = "both"


@pytest.fixture(scope="module", params=["sqlite", "postgresql-18", "postgresql", "mariadb"])
def live_engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Each engine this machine runs (a skip, with the reason, where one cannot be had)."""
    spec = engines.get(request.param)
    try:
        provided = spec.provide()
    except engines.Unavailable as exc:
        pytest.skip(f"{spec.name}: {exc}")
    yield provided
    provided.stop()
