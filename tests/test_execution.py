"""The store runs its own statements on the driver: a replay fires none of SQLAlchemy's cursor events (sync on
psycopg, async on asyncpg) and crosses SQLAlchemy's greenlet bridge only to open and end its transaction;
`cursor_events=True` brings the events back. The private SQLAlchemy names this leans on are pinned here, so an
upgrade that moves one fails loudly instead of silently changing how errors are handled."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import URL

from idem_dialects import IdempotencyStore
from idem_dialects.engines import Server, Unavailable, get

MAX_SWITCHES = 7  # half of the 14 one replay took through SQLAlchemy's AsyncConnection per statement


@pytest.fixture(scope="module")
def pg() -> Iterator[Server]:
    try:
        server = get("postgresql").provide()
    except Unavailable as exc:
        pytest.skip(f"postgresql unavailable: {exc}")
    yield server
    server.stop()


def _events(engine: Any) -> list[str]:
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


@pytest.mark.parametrize("cursor_events", [False, True], ids=["native", "cursor_events"])
def test_sync_replay_fires_no_cursor_event_unless_asked(pg: Server, cursor_events: bool) -> None:
    url = pg.url.set(drivername="postgresql+psycopg")
    with IdempotencyStore.from_url(url, table_prefix=f"ex{uuid.uuid4().hex[:6]}_",
                                   cursor_events=cursor_events) as store:
        store.create_tables()
        try:
            store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "first")
            seen = _events(store.engine)
            again = store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "never")
            assert again.replayed and again.response == "first"
            if cursor_events:
                assert seen and seen[0].lstrip().upper().startswith("WITH INS")  # the claim, through SQLAlchemy
            else:
                assert seen == []
        finally:
            store.drop_tables()


def _asyncpg_url(pg: Server) -> URL:
    pytest.importorskip("asyncpg", reason="asyncpg is not installed (pip install 'idem-dialects[async]')")
    return pg.url.set(drivername="postgresql+asyncpg")


@pytest.mark.parametrize("cursor_events", [False, True], ids=["native", "cursor_events"])
def test_async_replay_fires_no_cursor_event_unless_asked_and_crosses_the_bridge_twice(pg: Server,
                                                                                     cursor_events: bool) -> None:
    greenlet = pytest.importorskip("greenlet")
    from idem_dialects import AsyncIdempotencyStore

    url = _asyncpg_url(pg)

    async def main() -> tuple[list[str], int, bool]:
        async with AsyncIdempotencyStore.from_url(url, table_prefix=f"ex{uuid.uuid4().hex[:6]}_",
                                                  cursor_events=cursor_events) as store:
            await store.create_tables()
            try:
                async def effect(conn: Any) -> str:
                    return "first"

                await store.run(scope="s", operation="op", key="k", request={}, effect=effect)
                seen = _events(store.engine.sync_engine)
                switches: list[str] = []
                previous = greenlet.settrace(lambda kind, args: switches.append(kind))
                try:
                    again = await store.run(scope="s", operation="op", key="k", request={}, effect=effect)
                finally:
                    greenlet.settrace(previous)
                return list(seen), len(switches), again.replayed
            finally:
                await store.drop_tables()

    seen, switches, replayed = asyncio.run(main())
    assert replayed
    if cursor_events:
        assert seen  # the claim went through SQLAlchemy's AsyncConnection (and its greenlet hops)
    else:
        assert seen == []
        assert switches <= MAX_SWITCHES, f"{switches} greenlet switches for one replay"


@pytest.mark.parametrize("where", ["begin", "commit"])
def test_an_interrupted_native_statement_never_hands_its_connection_on(pg: Server, where: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A task cancelled while a native statement awaits the server may leave a transaction the adapter never
    recorded (its BEGIN went through, the cancellation arrived before asyncpg said so) or one it has forgotten (a
    COMMIT interrupted): no ROLLBACK would end it, so the pool must replace the connection. Otherwise the next run on
    it works inside that stale transaction, and its effect and record stay invisible to every other connection -
    lost the moment the stale connection is closed."""
    from sqlalchemy import text

    from idem_dialects import AsyncIdempotencyStore
    from idem_dialects.drivers.asyncpg import Asyncpg

    url = _asyncpg_url(pg)
    real_execute, real_commit = Asyncpg.execute, Asyncpg.commit
    interrupted: list[str] = []

    async def begin_then_cancelled(self: Asyncpg, connection: Any, plan: Any, parameters: Any) -> Any:
        if not interrupted:
            interrupted.append(plan.sql)
            await connection._connection.execute("BEGIN")  # the server began; asyncpg's caller never heard back
            raise asyncio.CancelledError
        return await real_execute(self, connection, plan, parameters)

    async def commit_cancelled(self: Asyncpg, connection: Any) -> None:
        if not interrupted:
            interrupted.append("COMMIT")
            connection._transaction = None  # as the driver forgets it, before the COMMIT's reply
            raise asyncio.CancelledError
        committing = real_commit(self, connection)
        if committing is not None:
            await committing

    async def main() -> tuple[Any, int]:
        async with AsyncIdempotencyStore.from_url(url, table_prefix=f"ex{uuid.uuid4().hex[:6]}_",
                                                  pool_size=1, max_overflow=0) as store:
            await store.create_tables()
            try:
                async def effect(conn: Any) -> str:
                    return "done"

                if where == "begin":
                    monkeypatch.setattr(Asyncpg, "execute", begin_then_cancelled)
                else:
                    monkeypatch.setattr(Asyncpg, "commit", commit_cancelled)
                with pytest.raises(asyncio.CancelledError):
                    await store.run(scope="s", operation="op", key="k", request={}, effect=effect)
                monkeypatch.undo()
                result = await store.run(scope="s", operation="op", key="k", request={}, effect=effect)
                # The one pooled connection was replaced: another engine sees the completed record.
                other = IdempotencyStore.from_url(pg.url.set(drivername="postgresql+psycopg"),
                                                  table_prefix=store.table_prefix)
                try:
                    with other.engine.connect() as conn:
                        done = conn.execute(text(
                            f"SELECT count(*) FROM {store.tables.records.name} WHERE completed_at IS NOT NULL"
                        )).scalar_one()
                finally:
                    other.close()
                return result, done
            finally:
                await store.drop_tables()

    result, done = asyncio.run(main())
    assert interrupted and result.response == "done" and done == 1


# --- to_completion: a transaction's end, carried through a cancellation of its task ------------------------------


def test_an_end_with_nothing_to_wait_for_runs_in_the_callers_task() -> None:
    """No task per request where the end never waits (the COMMIT already sent natively)."""
    from idem_dialects.execution.aio import to_completion

    async def work() -> asyncio.Task[Any] | None:
        return asyncio.current_task()

    async def main() -> None:
        assert await to_completion(work()) is asyncio.current_task()

    asyncio.run(main())


def test_an_end_that_waits_is_finished_despite_a_cancellation_which_is_raised_after() -> None:
    from idem_dialects.execution.aio import to_completion

    steps: list[str] = []

    async def work() -> str:
        steps.append("before")
        await asyncio.sleep(0.05)
        steps.append("after")
        return "done"

    async def main() -> None:
        task = asyncio.create_task(to_completion(work()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert steps == ["before", "after"]
        assert await to_completion(work()) == "done"  # uncancelled: the value comes back from the task

    asyncio.run(main())


def test_a_cancellation_during_the_part_that_runs_inline_is_raised_once_it_is_done() -> None:
    """The task cancelled while the end runs without waiting (a commit listener did so): the end finishes, then the
    cancellation is raised from to_completion itself, as from a wait for the end's own task."""
    from idem_dialects.execution.aio import to_completion

    after: list[str] = []

    async def work() -> str:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        return "done"

    async def main() -> None:
        try:
            await to_completion(work())
        except asyncio.CancelledError:
            after.append("cancelled")
            raise
        after.append("went on")  # pragma: no cover - what must not happen

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    assert after == ["cancelled"]


def test_an_end_that_fails_after_waiting_raises_its_error() -> None:
    from idem_dialects.execution.aio import to_completion

    async def work() -> None:
        await asyncio.sleep(0)
        raise LookupError("the end failed")

    async def main() -> None:
        with pytest.raises(LookupError, match="the end failed"):
            await to_completion(work())

    asyncio.run(main())
