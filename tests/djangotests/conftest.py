"""The Django tests' project (tests/django_site) configured for pytest-django, and what the tests share: users, a
client per alias, row and record counts."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from idem_dialects.engines import started

django = pytest.importorskip("django", reason="the [django] extra is not installed")
pytest.importorskip("rest_framework", reason="djangorestframework (the [dev] extra) is not installed")
pytest.importorskip("httpx", reason="httpx (the [dev] extra) is not installed")
# pytest-django sets Django up only for settings it saw before collection: set up here. The variable goes again once
# the settings are loaded, so subprocesses of other tests (pytest runs of their own) do not inherit this project.
os.environ["DJANGO_SETTINGS_MODULE"] = "django_site.settings"
django.setup()
del os.environ["DJANGO_SETTINGS_MODULE"]

from django.conf import settings  # noqa: E402
from django_common import Site  # noqa: E402


@pytest.fixture(params=["default", "postgresql", "mariadb"], ids=["sqlite", "postgresql", "mariadb"])
def alias(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name not in settings.DATABASES:
        pytest.skip(settings.UNAVAILABLE.get(name, f"no {name} database"))
    # The settings may have been read before the run refused servers (this directory named on the command line).
    if name != "default" and started.refusal() is not None:
        pytest.skip(f"{name}: {started.refusal()}")
    return name


@pytest.fixture
def site(alias: str, live_server: Any, django_user_model: Any) -> Iterator[Site]:
    for name in ("alice", "bob"):
        django_user_model.objects.create_user(name, password=f"{name}-password")
    yield Site(live_server.url, alias)
