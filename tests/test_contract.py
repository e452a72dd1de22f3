"""The backend contract is declared and small, and every registered backend meets it."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pytest
from contract_common import own_members
from sqlalchemy import func
from sqlalchemy.sql.elements import ColumnElement

from idem_dialects import ConfigurationError, dialects
from idem_dialects.dialects.base import REQUIRED, Backend
from idem_dialects.dialects.classify import ErrorClassifier
from idem_dialects.drivers.pysqlite import DRIVER as PYSQLITE


def test_the_backend_base_class_is_small() -> None:
    members = own_members(Backend)
    assert set(REQUIRED) <= set(members)
    assert {"name", "drivers", "classifier"} <= set(members) - set(vars(Backend))  # the annotation-only ones count
    assert len(members) <= 30, members


@pytest.mark.parametrize("name", dialects.names())
def test_every_registered_backend_defines_the_required_members(name: str) -> None:
    backend = dialects.load(name)
    assert dialects.missing_members(backend) == []
    assert isinstance(backend.name, str) and backend.drivers and issubclass(backend.classifier, ErrorClassifier)


class _Classifier(ErrorClassifier):
    def is_duplicate(self, exc: Any) -> bool:
        return False


class _NoClock(Backend):
    """A third-party backend that forgot `now_plus` and `classifier`."""

    name = "noclock"
    drivers = (PYSQLITE,)


class _Complete(_NoClock):
    classifier = _Classifier

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        return func.now()


def test_a_backend_missing_a_required_member_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    registry: Mapping[str, Any] = dialects._registry
    monkeypatch.setitem(registry, "noclock", _NoClock)  # type: ignore[index]
    with pytest.raises(ConfigurationError, match="classifier, now_plus"):
        dialects.load("noclock")
    monkeypatch.setitem(registry, "noclock", _Complete)  # type: ignore[index]
    assert dialects.load("noclock") is _Complete
