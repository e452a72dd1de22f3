"""Nothing the user stored reaches a log the library controls, at any level: with SQLAlchemy's ``echo="debug"``
(statements, parameters and result rows) and the root logger at DEBUG (every driver's own logger too), 100 runs and
100 replays on every live engine, with its sync driver and each async driver, leave no stored response (as text or
hex), request body or claim token in the captured output, and the store warns of nothing.

Also: the warning `complete()` logs when it lost its claim puts key, scope and operation in their places."""

from __future__ import annotations

import asyncio
import io
import logging
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from async_common import async_store_class
from sqlalchemy import select
from sqlalchemy.engine import URL

from idem_dialects import Claimed, IdempotencyStore, IdemWarning, LeaseLost, dialects

RESPONSE = "resp_sk_live_9f3a"
REQUEST = "req_card_4242_secret"
RUNS = 100


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Everything logged anywhere, at DEBUG, while the test runs."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _run_sync(url: URL, prefix: str) -> None:
    with IdempotencyStore.from_url(url, table_prefix=prefix, echo="debug") as store:
        store.create_tables()
        for i in range(RUNS):
            for _ in range(2):  # the first run, then its replay
                store.run(scope="s", operation="op", key=f"k{i}", request={"card": REQUEST},
                          effect=lambda conn: {"token": RESPONSE})


def _run_async(url: URL, prefix: str) -> None:
    store_class = async_store_class(url.get_driver_name())

    async def effect(conn: Any) -> Any:
        return {"token": RESPONSE}

    async def main() -> None:
        async with store_class.from_url(url, table_prefix=prefix, echo="debug") as store:
            await store.create_tables()
            for i in range(RUNS):
                for _ in range(2):
                    await store.run(scope="s", operation="op", key=f"k{i}", request={"card": REQUEST}, effect=effect)

    asyncio.run(main())


def _tokens_and_drop(url: URL, prefix: str) -> list[str]:
    """The claim tokens the runs stored (read with logging back to normal), then the tables dropped."""
    with IdempotencyStore.from_url(url, table_prefix=prefix) as store:
        with store.engine.connect() as conn:
            tokens = [str(t) for t in conn.execute(select(store.tables.records.c.claim_token)).scalars()]
        store.drop_tables()
    return tokens


def _drivers(url: URL) -> list[str | None]:
    """None for the engine's sync driver, then each async driver usable here."""
    with IdempotencyStore.from_url(url) as store:
        return [None, *dialects.usable_drivers(type(store.backend), asynchronous=True)]


def test_no_stored_value_in_any_log(live_engine: Any, captured: io.StringIO) -> None:
    for driver in _drivers(live_engine.url):
        url = live_engine.url if driver is None else live_engine.url.set(
            drivername=f"{live_engine.url.get_backend_name()}+{driver}")
        prefix = f"lg{uuid.uuid4().hex[:8]}_"
        captured.seek(0)
        captured.truncate()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                (_run_sync if driver is None else _run_async)(url, prefix)
            finally:
                logging.getLogger().setLevel(logging.WARNING)  # reading the tokens back must not log them
                tokens = _tokens_and_drop(live_engine.url, prefix)
                logging.getLogger().setLevel(logging.DEBUG)
        text = captured.getvalue()
        assert len(tokens) == RUNS and "sqlalchemy.engine" in text, "the runs were not logged at all"
        leaked = [v for v in (RESPONSE, RESPONSE.encode().hex(), REQUEST, *tokens) if v in text]
        assert leaked == [], f"{url.drivername}: {len(leaked)} stored values logged"
        assert [w for w in seen if issubclass(w.category, IdemWarning)] == []


def test_lost_claim_warning_names_key_scope_operation(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'w.db'}") as store:
        store.create_tables()
        with store.transaction() as conn:
            claimed = store.claim(conn, scope="tenant-9", operation="debit:v2", key="key-77", request={})
            assert isinstance(claimed, Claimed)
            store.complete(conn, claimed, {"ok": 1})
        caplog.set_level(logging.WARNING, logger="idem_dialects")
        with pytest.raises(LeaseLost), store.transaction() as conn:
            store.complete(conn, claimed, {"ok": 2})  # completed already: the fenced UPDATE matches nothing
    (record,) = [r for r in caplog.records if "lost the claim" in r.getMessage()]
    assert record.args == ("key-77", "tenant-9", "debit:v2")
    assert "lost the claim on key 'key-77' in 'tenant-9'/'debit:v2'" in record.getMessage()
