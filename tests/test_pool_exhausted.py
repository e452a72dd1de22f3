"""An exhausted connection pool (issue 40, item 3): every connection of SQLAlchemy's pool in use for its whole
pool_timeout is PoolExhausted, a library error with the pool's numbers and the fix, on the sync and the async store
(PostgreSQL 15 through psycopg and asyncpg). It is contention, so `run` retries it within its budget: a burst that
outlasts pool_timeout is absorbed, and a pool that stays full ends in RetriesExhausted with it as the last error.
Before, SQLAlchemy's own TimeoutError reached the caller (180 of 288 calls in a test with a small pool)."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import URL

from idem_dialects import IdempotencyStore, RetriesExhausted, RetryPolicy, TransientError
from idem_dialects.engines import Unavailable, get
from idem_dialects.errors import PoolExhausted

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'idem-dialects[postgresql]')")

SMALL_POOL = {"pool_size": 1, "max_overflow": 0, "pool_timeout": 0.2}


@pytest.fixture(scope="module")
def pg_url() -> Iterator[URL]:
    try:
        provided = get("postgresql").provide()
    except Unavailable as exc:
        pytest.skip(f"postgresql unavailable: {exc}")
    yield provided.url.set(drivername="postgresql+psycopg")
    provided.stop()


def _prefix() -> str:
    return f"px{secrets.token_hex(4)}_"


def _check(error: BaseException, checked_out: int = 1) -> None:
    assert isinstance(error, PoolExhausted) and isinstance(error, TransientError)
    assert (error.pool_size, error.max_overflow, error.timeout, error.checked_out) == (1, 0, 0.2, checked_out)
    text = str(error)
    for words in ("pool_size=1", "max_overflow=0", "pool_timeout=0.2s", "bigger pool", "fewer concurrent callers",
                  "longer pool_timeout"):
        assert words in text, text
    assert error.cause == "pool exhausted"


def test_exhausted_pool_sync(pg_url: URL) -> None:
    with IdempotencyStore.from_url(pg_url, table_prefix=_prefix(), **SMALL_POOL) as store:
        store.create_tables()
        calls: list[str] = []
        try:
            held = store.engine.connect()
            with pytest.raises(PoolExhausted) as caught:
                with store.transaction():
                    pass
            _check(caught.value)
            with pytest.raises(RetriesExhausted) as exhausted:
                store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: calls.append("k"),
                          retry=RetryPolicy(total=1))
            _check(exhausted.value.last_error)
            assert set(exhausted.value.causes) == {"pool exhausted"} and exhausted.value.attempts >= 2
            assert calls == []
            # The holder gives its connection back while `run` retries: the call goes through.
            threading.Timer(0.5, held.close).start()
            result = store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "done",
                               retry=RetryPolicy(total=10))
            assert result.response == "done" and store.retries["pool exhausted"] >= 1
        finally:
            store.drop_tables()


def test_burst_on_a_small_pool_is_absorbed(pg_url: URL) -> None:
    """16 threads on a pool of 2 with pool_timeout=0.05 s, each effect holding its connection 20 ms: many waits
    outlast the pool_timeout; every call returns its result, no error reaches a caller."""
    with IdempotencyStore.from_url(pg_url, table_prefix=_prefix(), pool_size=2, max_overflow=0,
                                   pool_timeout=0.05) as store:
        store.create_tables()
        errors: list[BaseException] = []
        done: list[str] = []
        lock = threading.Lock()

        def effect(conn: Any) -> str:
            time.sleep(0.02)
            return "ok"

        def worker(w: int) -> None:
            for i in range(18):
                try:
                    store.run(scope="s", operation="op", key=f"{w}-{i}", request={}, effect=effect)
                except Exception as exc:  # collected: the assertion says which
                    with lock:
                        errors.append(exc)
                else:
                    with lock:
                        done.append(f"{w}-{i}")

        try:
            threads = [threading.Thread(target=worker, args=(w,)) for w in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == [], f"{len(errors)} of 288 calls failed, e.g. {errors[:2]!r}"
            assert len(done) == 288 and store.retries["pool exhausted"] > 0
        finally:
            store.drop_tables()


def test_exhausted_pool_async(pg_url: URL) -> None:
    from async_common import async_store_class

    store_class = async_store_class("asyncpg")

    async def scenario() -> None:
        store = store_class.from_url(pg_url.set(drivername="postgresql+asyncpg"), table_prefix=_prefix(),
                                     **SMALL_POOL)
        await store.create_tables()
        calls: list[str] = []

        async def effect(conn: Any) -> str:
            calls.append("k")
            return "done"

        try:
            held = await store.engine.connect()
            with pytest.raises(PoolExhausted) as caught:
                async with store.transaction():
                    pass
            _check(caught.value)
            with pytest.raises(RetriesExhausted) as exhausted:
                await store.run(scope="s", operation="op", key="k", request={}, effect=effect,
                                retry=RetryPolicy(total=1))
            _check(exhausted.value.last_error)
            assert set(exhausted.value.causes) == {"pool exhausted"} and calls == []

            async def give_back() -> None:
                await asyncio.sleep(0.5)
                await held.close()

            giving = asyncio.create_task(give_back())
            result = await store.run(scope="s", operation="op", key="k", request={}, effect=effect,
                                     retry=RetryPolicy(total=10))
            await giving
            assert result.response == "done" and calls == ["k"] and store.retries["pool exhausted"] >= 1
        finally:
            await store.drop_tables()
            await store.close()

    asyncio.run(scenario())
