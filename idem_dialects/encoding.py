"""The default encoder: common Python values a request or response carries, turned into JSON.

Pass it (or your own function of the same shape) as ``IdempotencyStore(..., encoder=default_encoder)``. The store
calls the encoder only for values that are not plain JSON; whatever it returns is checked (and encoded again where
needed) like any other value. A replay returns the *encoded* form: the table below is what comes back.

==========================================  ===========================================================
value                                       stored and replayed as
==========================================  ===========================================================
``Decimal("1.10")``                         ``"1.10"`` (a string: exact, scale kept; 1.10 and 1.1 differ)
``datetime`` / ``date`` / ``time``          ISO 8601 string (``isoformat()``; naive values stay naive)
``UUID``                                    its canonical string ``"12345678-1234-..."``
``Enum`` (``IntEnum``, ``StrEnum``, ...)    its ``.value``
dataclass instance                          a dict of its fields (each field encoded in turn)
pydantic model (anything with model_dump)   ``model_dump(mode="json")``
subclass of dict/list/str/int/float         the plain base type (``OrderedDict`` -> ``dict``)
==========================================  ===========================================================

Anything else raises ``TypeError``, which the store reports as ``InvalidPayload``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from decimal import Decimal
from enum import Enum
from typing import Any


def default_encoder(value: Any) -> Any:
    """JSON for `value` (see the module's table), or TypeError."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    for base in (int, float, str, dict, list):  # bool cannot be subclassed
        if isinstance(value, base):
            convert: Any = base
            return convert(value)
    raise TypeError(f"default_encoder cannot encode {type(value).__name__}")
