"""Every mistake in a request, response or argument raises a documented IdemError subclass before any SQL:
payloads (depth, big integers, subclasses, values that need an encoder), durations and batch sizes.
The encoder hook and what a replay returns."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from idem_dialects import IdempotencyStore, InvalidPayload, default_encoder
from idem_dialects.conformance.support import StatementLog
from idem_dialects.fingerprint import MAX_DEPTH, MAX_SAFE_INTEGER, encode_response, fingerprint
from idem_dialects.limits import MAX_BATCH_SIZE, MAX_LEASE, MAX_RETENTION


class Color(enum.IntEnum):
    RED = 1


class Mood(enum.StrEnum):
    CALM = "calm"


@dataclasses.dataclass
class Money:
    amount: Decimal
    currency: str


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[IdempotencyStore, list[str]]]:
    log = StatementLog()
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'inputs.db'}", statement_hook=log) as store:
        store.create_tables()
        log.sql.clear()
        yield store, log.sql


def _records(store: IdempotencyStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(store.tables.records)).scalar_one())


BAD_REQUESTS = {
    "nested 100,000 deep": nested(100_000),
    "10**5000": 10**5000,
    "2**53": 2**53,
    "Decimal without encoder": {"amount": Decimal("1.10")},
    "IntEnum": {"color": Color.RED},
    "StrEnum": Mood.CALM,
    "OrderedDict": OrderedDict(a=1),
    "float subclass": type("F", (float,), {})(1.5),
    "datetime": dt.datetime(2026, 1, 1),
}


@pytest.mark.parametrize("request_value", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_bad_requests_raise_invalid_payload_before_sql(store: Any, request_value: Any) -> None:
    s, statements = store
    with pytest.raises(InvalidPayload) as err:
        s.run(scope="s", operation="op", key="k", request=request_value, effect=lambda conn: 1)
    assert err.value.field == "request"
    assert statements == [] and _records(s) == 0


@pytest.mark.parametrize("response", [nested(100_000), 10**5000, Decimal("1.10"), Color.RED, {"when": dt.date.today()}],
                         ids=["deep", "10**5000", "Decimal", "IntEnum", "date"])
def test_bad_responses_raise_invalid_payload_and_roll_back(store: Any, response: Any) -> None:
    s, _ = store
    with pytest.raises(InvalidPayload) as err:
        s.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: response)
    assert err.value.field == "response" and _records(s) == 0


def test_the_limits_themselves() -> None:
    fingerprint(nested(MAX_DEPTH))
    with pytest.raises(InvalidPayload, match=f"deeper than {MAX_DEPTH}"):
        fingerprint(nested(MAX_DEPTH + 1))
    assert fingerprint(MAX_SAFE_INTEGER) and fingerprint(-MAX_SAFE_INTEGER)
    with pytest.raises(InvalidPayload, match=r"2\*\*53 - 1"):
        fingerprint(-MAX_SAFE_INTEGER - 1)
    assert encode_response(10**3999)  # responses keep big integers, up to 4,000 digits
    with pytest.raises(InvalidPayload, match="4000 digits"):
        encode_response(-(10**4000))


def test_decimal_without_encoder_names_the_option() -> None:
    with pytest.raises(InvalidPayload, match=r"encoder=idem_dialects\.default_encoder"):
        fingerprint({"amount": Decimal("1.10")})


def test_int_subclass_is_refused_not_replayed_as_int() -> None:
    with pytest.raises(InvalidPayload, match=r"Color at \$\.color is a subclass of int"):
        encode_response({"color": Color.RED})


def test_encoder_stores_and_replays_documented_types(tmp_path: Path) -> None:
    when = dt.datetime(2026, 12, 3, 9, 15, tzinfo=dt.UTC)
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    response = {"amount": Decimal("1.10"), "at": when, "id": ident, "color": Color.RED, "mood": Mood.CALM,
                "money": Money(Decimal("2.50"), "EUR"), "ordered": OrderedDict(b=1, a=2), "day": when.date()}
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'enc.db'}", encoder=default_encoder) as s:
        s.create_tables()
        request = {"amount": Decimal("1.10"), "money": Money(Decimal("1"), "EUR")}
        first = s.run(scope="s", operation="op", key="k", request=request, effect=lambda conn: response)
        assert first.response is response and not first.replayed  # the first run returns the caller's object
        again = s.run(scope="s", operation="op", key="k", request=request, effect=lambda conn: "never")
        assert again.replayed
        assert again.response == {"amount": "1.10", "at": "2026-12-03T09:15:00+00:00",
                                   "id": "12345678-1234-5678-1234-567812345678", "color": 1, "mood": "calm",
                                   "money": {"amount": "2.50", "currency": "EUR"}, "ordered": {"b": 1, "a": 2},
                                   "day": "2026-12-03"}
        # The request is fingerprinted in its encoded form: 1.10 and 1.1 are different requests (scale is kept).
        assert fingerprint(request, encoder=default_encoder) == fingerprint(
            {"amount": "1.10", "money": {"amount": "1", "currency": "EUR"}})


def test_pydantic_models_encode_through_model_dump() -> None:
    class Model:  # the duck type default_encoder relies on (pydantic v2's BaseModel.model_dump)
        def model_dump(self, mode: str = "python") -> dict[str, Any]:
            assert mode == "json"
            return {"amount": "1.10"}

    assert encode_response(Model(), default_encoder) == b'j{"amount":"1.10"}'


def test_encoder_errors_are_invalid_payload_without_the_value() -> None:
    def refuse(value: Any) -> Any:
        raise TypeError(f"cannot encode {value!r}")

    with pytest.raises(InvalidPayload, match="encoder refused") as err:
        encode_response({"secret": {1, 2}}, refuse)
    assert "{1, 2}" not in str(err.value) and err.value.__cause__ is None
    with pytest.raises(InvalidPayload, match="not a JSON value"):
        encode_response(Decimal(1), lambda value: value)  # an encoder that returns its input
    with pytest.raises(InvalidPayload, match="deeper than"):
        encode_response(Decimal(1), lambda value: [value])  # an encoder that never ends


@pytest.mark.parametrize("lease", [timedelta.max, MAX_LEASE + timedelta(microseconds=1), timedelta(days=36_500_000),
                                   timedelta(0), timedelta(seconds=-1), 90])
def test_lease_bounds(store: Any, lease: Any) -> None:
    s, statements = store
    with pytest.raises(InvalidPayload, match=r"lease: .* 365 days"):
        s.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1, lease=lease)
    assert statements == [] and _records(s) == 0


def test_the_longest_lease_works(store: Any) -> None:
    s, _ = store
    assert s.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1, lease=MAX_LEASE).response == 1


@pytest.mark.parametrize(("older_than", "batch_size", "field"), [
    (timedelta(days=3_650_000), 1000, "older_than"), (timedelta.max, 1000, "older_than"),
    (timedelta(seconds=-1), 1000, "older_than"), (timedelta(days=1), 2**63, "batch_size"),
    (timedelta(days=1), MAX_BATCH_SIZE + 1, "batch_size"), (timedelta(days=1), 0, "batch_size"),
    (timedelta(days=1), True, "batch_size"),
])
def test_purge_bounds(store: Any, older_than: Any, batch_size: Any, field: str) -> None:
    s, statements = store
    s.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1)
    statements.clear()
    with pytest.raises(InvalidPayload) as err:
        s.purge(older_than=older_than, batch_size=batch_size)
    assert err.value.field == field and statements == [] and _records(s) == 1


def test_purge_at_the_bounds_runs(store: Any) -> None:
    s, _ = store
    s.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1)
    assert s.purge(older_than=MAX_RETENTION, batch_size=MAX_BATCH_SIZE) == 0
