"""A response the server would refuse in one statement (issue 40, item 1): refused before the completion is sent,
with one library error naming the limit, and the effect called once. Before, MariaDB's max_allowed_packet (16 MiB)
made PyMySQL lose its connection mid-send (retried for the whole budget: the effect re-ran every time) and asyncmy
raise OperationalError 1153 as it was.

The limit is the server's own, read once per store (`Features.max_statement_bytes`); what a response takes of it is
the driver's (`Driver.sent_size`: PyMySQL sends bytes as hex, asyncmy escapes seven byte values), so the boundary
checks send responses just under it (they complete) and just over it (refused, nothing sent)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from idem_dialects import IdempotencyStore, RetryPolicy
from idem_dialects.engines import Unavailable, get
from idem_dialects.errors import ResponseTooLarge
from idem_dialects.limits import STATEMENT_MARGIN

pytest.importorskip("pymysql", reason="PyMySQL is not installed (pip install 'idem-dialects[mysql]')")

MIB = 1024 * 1024
TAG = 1  # encode_response's kind byte in front of a bytes response
RETRY = RetryPolicy(total=30)  # the default budget: a retried failure would take all of it


@pytest.fixture(scope="module")
def mariadb() -> Iterator[URL]:
    try:
        provided = get("mariadb").provide()
    except Unavailable as exc:
        pytest.skip(f"mariadb unavailable: {exc}")
    yield provided.url
    provided.stop()


@pytest.fixture(scope="module")
def packet(mariadb: URL) -> int:
    engine = create_engine(mariadb.set(drivername="mariadb+pymysql"))
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT @@SESSION.max_allowed_packet")).scalar_one())
    finally:
        engine.dispose()


def _prefix() -> str:
    return f"rs{secrets.token_hex(4)}_"


def test_oversize_response_pymysql(mariadb: URL, packet: int) -> None:
    """20 MiB on PyMySQL: ResponseTooLarge naming max_allowed_packet at once (nothing retried), the effect called
    once, nothing stored; a response just under the limit completes and replays."""
    assert packet < 20 * MIB, "the check needs a server whose max_allowed_packet is below 20 MiB"
    with IdempotencyStore.from_url(mariadb.set(drivername="mariadb+pymysql"), table_prefix=_prefix(),
                                   retry=RETRY) as store:
        store.create_tables()
        try:
            calls: list[int] = []

            def effect(size: int) -> Any:
                def run(conn: Any) -> bytes:
                    calls.append(size)
                    return b"x" * size
                return run

            with pytest.raises(ResponseTooLarge) as caught:
                store.run(scope="s", operation="op", key="big", request={}, effect=effect(20 * MIB))
            assert calls == [20 * MIB]
            error = caught.value
            assert "max_allowed_packet" in str(error) and f"{packet:,}" in str(error)
            assert error.limit == packet - STATEMENT_MARGIN and error.size > error.limit
            assert store.features.max_statement_bytes == packet
            assert store.retries.total() == 0
            # PyMySQL sends bytes as hex: two bytes of statement per byte, so the largest response is half the limit.
            fits = (packet - STATEMENT_MARGIN) // 2 - 64
            done = store.run(scope="s", operation="op", key="big", request={}, effect=effect(fits))
            assert not done.replayed and len(done.response) == fits  # the key was left free: nothing was stored
            again = store.run(scope="s", operation="op", key="big", request={}, effect=effect(1))
            assert again.replayed and again.response == b"x" * fits
            with pytest.raises(ResponseTooLarge):
                store.run(scope="s", operation="op", key="over", request={}, effect=effect(fits + 64))
        finally:
            store.drop_tables()


def test_oversize_response_asyncmy(mariadb: URL, packet: int) -> None:
    """20 MiB on asyncmy: ResponseTooLarge at once (nothing retried), the effect called once; asyncmy escapes quotes,
    backslashes and four control bytes, so a response of those is refused at half the size a plain one is, before it
    is sent."""
    from async_common import async_store_class

    store_class = async_store_class("asyncmy")

    async def scenario() -> None:
        store = store_class.from_url(mariadb.set(drivername="mariadb+asyncmy"), table_prefix=_prefix(), retry=RETRY)
        await store.create_tables()
        try:
            calls: list[int] = []

            def effect(value: bytes) -> Any:
                async def run(conn: Any) -> bytes:
                    calls.append(len(value))
                    return value
                return run

            with pytest.raises(ResponseTooLarge) as caught:
                await store.run(scope="s", operation="op", key="big", request={}, effect=effect(b"x" * (20 * MIB)))
            assert calls == [20 * MIB] and store.retries.total() == 0
            assert "max_allowed_packet" in str(caught.value) and caught.value.size == 20 * MIB + TAG + 11
            room = packet - STATEMENT_MARGIN - len("_binary X''") - TAG
            plain = await store.run(scope="s", operation="op", key="plain", request={},
                                    effect=effect(b"x" * (room - 64)))
            assert len(plain.response) == room - 64
            quotes = b"'\\" * ((room // 2 + 64) // 2)  # within the limit by length, over it once escaped
            with pytest.raises(ResponseTooLarge):
                await store.run(scope="s", operation="op", key="quotes", request={}, effect=effect(quotes))
            half = b"'\\" * ((room // 2 - 64) // 2)
            done = await store.run(scope="s", operation="op", key="quotes", request={}, effect=effect(half))
            assert done.response == half and store.retries.total() == 0
        finally:
            await store.drop_tables()
            await store.close()

    asyncio.run(scenario())
