"""AsyncIdempotencyStore: the guards that keep sync and async apart, and the async API on SQLite (aiosqlite).

The protocol itself is proved by the conformance suite for both APIs (conformance/test_async.py and --idem-api)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

# SQLAlchemy's asyncio layer needs greenlet, and these tests run on aiosqlite: the [async] and [aiosqlite] extras.
pytest.importorskip("greenlet", reason="greenlet is not installed (pip install 'idem-dialects[async]')")
pytest.importorskip("aiosqlite", reason="aiosqlite is not installed (pip install 'idem-dialects[aiosqlite]')")

from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from idem_dialects import AsyncIdempotencyStore, AsyncMisuse, Claimed, IdemError, IdempotencyStore, Replayed, dialects
from idem_dialects.conformance.support import StatementLog
from idem_dialects.errors import MissingDriver


def test_sync_store_refuses_async_url_naming_the_async_store() -> None:
    with pytest.raises(AsyncMisuse, match="AsyncIdempotencyStore"):
        IdempotencyStore.from_url("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    with pytest.raises(AsyncMisuse, match="AsyncIdempotencyStore"):
        IdempotencyStore.from_url("sqlite+aiosqlite://")


def test_sync_store_refuses_async_engine() -> None:
    engine = create_async_engine("sqlite+aiosqlite://")
    with pytest.raises(AsyncMisuse, match="AsyncIdempotencyStore"):
        IdempotencyStore(engine)  # type: ignore[arg-type]
    with pytest.raises(AsyncMisuse, match="AsyncIdempotencyStore"):
        IdempotencyStore(engine.sync_engine)  # an Engine on an asyncio driver would fail with MissingGreenlet


def test_async_store_refuses_sync_url_and_engine() -> None:
    with pytest.raises(AsyncMisuse, match=r"IdempotencyStore\.from_url.*sqlite\+aiosqlite"):
        AsyncIdempotencyStore.from_url("sqlite://")
    with pytest.raises(AsyncMisuse, match="asyncpg"):
        AsyncIdempotencyStore.from_url("postgresql+psycopg2://nobody@127.0.0.1:1/none")
    with pytest.raises(AsyncMisuse, match="IdempotencyStore"):
        AsyncIdempotencyStore(create_engine("sqlite://"))  # type: ignore[arg-type]
    assert issubclass(AsyncMisuse, IdemError) and issubclass(AsyncMisuse, TypeError)


@pytest.mark.parametrize(("url", "backend"), [
    ("oracle+oracledb://u:p@127.0.0.1:1/?service_name=x", "oracle"),
    ("mssql+aioodbc://u:p@127.0.0.1:1/db?driver=FreeTDS", "mssql"),
    ("mariadb+asyncmy://u@127.0.0.1:1/db", "mariadb"),
    ("postgresql+psycopg://u@127.0.0.1:1/db", "postgresql"),  # psycopg 3's async mode
])
def test_from_url_builds_async_engines_offline(url: str, backend: str) -> None:
    """Every engine's async driver is accepted and gets its backend, without connecting."""
    try:
        store = AsyncIdempotencyStore.from_url(url)
    except MissingDriver as exc:  # e.g. pyodbc without the unixODBC system library
        pytest.skip(str(exc))
    assert type(store.backend) is dialects.load(backend) and store.engine.dialect.is_async


def test_effect_kinds_refused_before_any_sql(tmp_path: Path) -> None:
    """An `async def` effect to the sync store, a sync one to the async store: refused before a connection."""
    log = StatementLog()
    sync = IdempotencyStore.from_url(f"sqlite:///{tmp_path}/s.db", statement_hook=log)
    connects: list[object] = []  # no connection either: a pool checkout would be the first thing a run does
    event.listen(sync.engine, "checkout", lambda *a: connects.append(a))

    async def async_effect(conn: Any) -> int:
        return 1

    with pytest.raises(AsyncMisuse, match="AsyncIdempotencyStore"):
        sync.run(scope="s", operation="o", key="k", request={}, effect=async_effect)
    assert log.sql == [] and connects == []
    sync.close()

    async def main() -> None:
        url = f"sqlite+aiosqlite:///{tmp_path}/a.db"
        async with AsyncIdempotencyStore.from_url(url, statement_hook=log) as store:
            event.listen(store.engine.sync_engine, "checkout", lambda *a: connects.append(a))
            with pytest.raises(AsyncMisuse, match="async def"):
                await store.run(scope="s", operation="o", key="k", request={}, effect=lambda conn: 1)
        assert log.sql == [] and connects == []

    asyncio.run(main())


def test_sync_effect_returning_a_coroutine_is_refused_and_rolled_back(tmp_path: Path) -> None:
    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path}/s.db")
    store.create_tables()

    async def body() -> int:
        return 1

    with pytest.raises(AsyncMisuse, match="awaitable"):
        store.run(scope="s", operation="o", key="k", request={}, effect=lambda conn: body())
    future: asyncio.Future[int] = asyncio.Future(loop=asyncio.new_event_loop())  # an awaitable but no coroutine
    with pytest.raises(AsyncMisuse, match="awaitable"):
        store.run(scope="s", operation="o", key="k", request={}, effect=lambda conn: future)
    future.get_loop().close()
    assert store.run(scope="s", operation="o", key="k", request={}, effect=lambda conn: 2).response == 2
    store.close()


def test_async_step_by_step_and_run(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncIdempotencyStore.from_url(f"sqlite+aiosqlite:///{tmp_path}/a.db", table_prefix="t_") as store:
            await store.create_tables()
            async with store.transaction() as conn:
                assert isinstance(conn, AsyncConnection)
                outcome = await store.claim(conn, scope="s", operation="o", key="k", request={"a": 1})
                assert isinstance(outcome, Claimed)
                await store.complete(conn, outcome, b"\x00bytes", status=201)
            async with store.transaction() as conn:
                again = await store.claim(conn, scope="s", operation="o", key="k", request={"a": 1})
            assert isinstance(again, Replayed) and (again.response, again.status) == (b"\x00bytes", 201)

            async def effect(conn: AsyncConnection) -> Any:
                return (await conn.execute(text("select 41 + 1"))).scalar_one()

            first = await store.run(scope="s", operation="o", key="r", request={}, effect=effect)
            second = await store.run(scope="s", operation="o", key="r", request={}, effect=effect)
            assert (first.response, first.replayed, second.response, second.replayed) == (42, False, 42, True)
            with pytest.raises(AsyncMisuse, match="AsyncConnection"):
                await store.claim(object(), scope="s", operation="o", key="x", request={})  # type: ignore[arg-type]
            await store.drop_tables()

    asyncio.run(main())


def test_async_retries_sleep_on_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retryable errors are retried with asyncio.sleep (never time.sleep), counted like the sync store's."""
    import time

    from sqlalchemy.exc import OperationalError

    from idem_dialects import RetryCause

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(seconds: float, *args: Any) -> Any:
        slept.append(seconds)
        return await real_sleep(0)

    def blocking_sleep(seconds: float) -> None:
        raise AssertionError("time.sleep would block the event loop")

    failures = [OperationalError("SELECT 1", {}, ConnectionError("gone"), connection_invalidated=True)
                for _ in range(2)]

    async def effect(conn: AsyncConnection) -> str:
        if failures:
            raise failures.pop()
        return "ok"

    async def main() -> None:
        async with AsyncIdempotencyStore.from_url(f"sqlite+aiosqlite:///{tmp_path}/a.db") as store:
            await store.create_tables()
            monkeypatch.setattr(asyncio, "sleep", recording_sleep)
            monkeypatch.setattr(time, "sleep", blocking_sleep)
            result = await store.run(scope="s", operation="o", key="k", request={}, effect=effect)
            monkeypatch.undo()
            assert (result.response, result.replayed) == ("ok", False)
            assert dict(store.retries) == {RetryCause.CONNECTION: 2} and len(slept) == 2

    asyncio.run(main())


def test_cancelled_effect_propagates_and_rolls_back(tmp_path: Path) -> None:
    """Cancelling the task inside the effect propagates CancelledError unchanged; the claim rolled back, so the
    re-sent request runs its effect at once."""

    async def main() -> None:
        async with AsyncIdempotencyStore.from_url(f"sqlite+aiosqlite:///{tmp_path}/a.db") as store:
            await store.create_tables()
            entered = asyncio.Event()

            async def slow(conn: AsyncConnection) -> str:
                entered.set()
                await asyncio.sleep(30)
                return "never"

            task = asyncio.create_task(store.run(scope="s", operation="o", key="k", request={}, effect=slow))
            await entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

            async def fast(conn: AsyncConnection) -> str:
                return "ran"

            result = await store.run(scope="s", operation="o", key="k", request={}, effect=fast)
            assert (result.response, result.replayed) == ("ran", False)
            assert store.engine.sync_engine.pool.checkedout() == 0

    asyncio.run(main())
