"""Through a transaction-mode pooler (the `pgbouncer-transaction` engine: PgBouncer with pool_mode=transaction, the
URL saying ``?pooler=transaction``), many runs on many connections: every call returns, every key is applied once.
Without the option psycopg prepares a statement after its 5th execution and asyncpg prepares every one, and the next
transaction on another server session fails with "prepared statement ... does not exist / already exists". With a
plain URL (no option) the store learns it from the first such error (issue 40, item 2): the engine's connections
reopen without prepared statements and `run` retries, so no error reaches a caller (before: 13 % of psycopg calls,
71 % of asyncpg calls failed)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from idem_dialects import IdempotencyStore, Result
from idem_dialects.conformance.plugin import EngineUnderTest
from idem_dialects.conformance.support import Effects

WORKERS = 8
pytestmark = pytest.mark.idem_stack  # the pooler is what the pgbouncer-transaction stack adds


@pytest.mark.parametrize(("url", "calls"), [("declared", 3200), ("plain", 1600), ("misdeclared", 1600)])
def test_transaction_pooler_runs(idem_engine: EngineUnderTest, idem_make_store: Callable[..., IdempotencyStore],
                                 idem_observe: Callable[[str, object], None], url: str, calls: int) -> None:
    """3,200 runs of unique keys on 8 threads (sync store) or 8 tasks (async store, one column per driver) with the
    URL declaring the pooler; 1,600 with a plain URL (the store asks the first connection whether a pooler is in
    front) and 1,600 with one that says ``pooler=session`` (nothing asked: the first prepared statement the pooler
    loses teaches it): no error, one record and one effect per key."""
    if idem_engine.features.session_state:
        pytest.skip(f"{idem_engine.name}: no transaction-mode pooler declared (the URL has no pooler=transaction)")
    plain = idem_engine.url.difference_update_query(["pooler"])
    given = {"declared": None, "plain": plain, "misdeclared": plain.update_query_dict({"pooler": "session"})}[url]
    store = idem_make_store(given, pool_size=WORKERS, max_overflow=0)
    effects = Effects(store)
    effects.create()
    keys = [[f"pool-{w}-{i}" for i in range(calls // WORKERS)] for w in range(WORKERS)]
    results: list[Result] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(WORKERS)

    def worker(mine: list[str]) -> None:
        barrier.wait()
        for key in mine:
            try:
                result = store.run(scope="s", operation="op", key=key, request={"n": 1}, effect=effects.effect(key))
            except Exception as exc:  # collected: the check says which calls failed
                with lock:
                    errors.append(exc)
                continue
            with lock:
                results.append(result)

    threads = [threading.Thread(target=worker, args=(mine,)) for mine in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == [], f"{len(errors)} of {calls} calls failed, e.g. {errors[:3]!r}"
        assert len(results) == calls and not any(r.replayed for r in results)
        assert effects.per_key() == {k: 1 for mine in keys for k in mine}
        records = store.tables.records
        with store.engine.connect() as conn:
            stored: Any = conn.execute(select(func.count()).select_from(records)).scalar_one()
        assert stored == calls
        # Learned from the server with a plain URL, declared otherwise.
        assert not store.features.session_state
    finally:
        effects.drop()
    idem_observe(f"transaction pooler ({url} URL): {calls} runs on {WORKERS} workers", "0 errors, every key once")


def test_a_callers_own_missing_statement_stays_its_own() -> None:
    """The fallback above acts only on a connection opened with the driver's prepared statements: on one opened
    without them (the URL declares the pooler) an effect's own EXECUTE of a statement never prepared (SQLSTATE 26000)
    reaches the caller unchanged, the effect called once, nothing retried. (With a plain URL on a server without a
    pooler, the same error is taken once for a pooler's: prepared statements go off and the call is retried once.)"""
    from sqlalchemy import text
    from sqlalchemy.exc import ProgrammingError

    from idem_dialects.engines import Unavailable, get

    try:
        provided = get("postgresql").provide()
    except Unavailable as exc:
        pytest.skip(f"postgresql unavailable: {exc}")
    url = provided.url.set(drivername="postgresql+psycopg").update_query_dict({"pooler": "transaction"})
    calls: list[int] = []

    def effect(conn: Any) -> None:
        calls.append(1)
        conn.execute(text("EXECUTE idem_never_prepared"))

    try:
        with IdempotencyStore.from_url(url, table_prefix="poolown_") as store:
            store.create_tables()
            try:
                with pytest.raises(ProgrammingError) as caught:
                    store.run(scope="s", operation="op", key="k", request={}, effect=effect)
                assert getattr(caught.value.orig, "sqlstate", None) == "26000"
                assert calls == [1] and store.retries.total() == 0 and not caught.value.connection_invalidated
            finally:
                store.drop_tables()
    finally:
        provided.stop()


def test_without_a_pooler_prepared_statements_stay() -> None:
    """On a server reached directly with a plain URL, the first connection asks (without prepared statements) and
    is then reopened with them: psycopg keeps preparing after its 5th execution on every connection."""
    from idem_dialects.engines import Unavailable, get

    try:
        provided = get("postgresql").provide()
    except Unavailable as exc:
        pytest.skip(f"postgresql unavailable: {exc}")
    try:
        with IdempotencyStore.from_url(provided.url.set(drivername="postgresql+psycopg"), table_prefix="poolno_",
                                       pool_size=2) as store:
            store.create_tables()
            try:
                for i in range(3):
                    store.run(scope="s", operation="op", key=f"k{i}", request={}, effect=lambda conn: None)
                first, second = store.engine.raw_connection(), store.engine.raw_connection()
                try:
                    assert [c.driver_connection.prepare_threshold for c in (first, second)] == [5, 5]
                finally:
                    first.close()
                    second.close()
                assert store.features.session_state
            finally:
                store.drop_tables()
    finally:
        provided.stop()


def test_connections_opened_while_the_first_asks_are_reopened_with_prepared_statements() -> None:
    """Eight tasks open a new async engine's pool at once (asyncpg): every connection opens without prepared
    statements while the first asks whether a pooler is in front; once it answers "no", those that opened meanwhile
    are reopened with them at their next checkout, as the first is (before, they kept none for life: asyncpg then
    prepared each statement in a round trip of its own). Repeated on fresh engines, the opening being a race."""
    import asyncio

    from idem_dialects import AsyncIdempotencyStore
    from idem_dialects.dialects.pooler import UNPREPARED
    from idem_dialects.engines import Unavailable, get

    pytest.importorskip("asyncpg", reason="the asyncpg driver is not installed")
    try:
        provided = get("postgresql").provide()
    except Unavailable as exc:
        pytest.skip(f"postgresql unavailable: {exc}")

    async def effect(conn: Any) -> None:
        await asyncio.sleep(0.01)  # the tasks overlap: each holds a connection of its own

    async def opened_unprepared(store: AsyncIdempotencyStore, round_: int) -> list[bool]:
        await asyncio.gather(*(store.run(scope="s", operation="op", key=f"k{round_}-{i}", request={}, effect=effect)
                               for i in range(WORKERS)))
        held = [await store.engine.connect() for _ in range(WORKERS)]  # every pooled connection, checked out
        try:
            raws = [await conn.get_raw_connection() for conn in held]
            return [bool(raw.info.get(UNPREPARED)) or raw.driver_connection._stmt_cache.get_max_size() == 0
                    for raw in raws]
        finally:
            for conn in held:
                await conn.close()

    async def rounds() -> list[list[bool]]:
        found = []
        for round_ in range(5):
            store = AsyncIdempotencyStore.from_url(provided.url.set(drivername="postgresql+asyncpg"),
                                                   table_prefix="poolrace_", pool_size=WORKERS, max_overflow=0)
            try:
                if round_ == 0:
                    await store.create_tables()
                found.append(await opened_unprepared(store, round_))
                if round_ == 4:
                    await store.drop_tables()
            finally:
                await store.close()
        return found

    try:
        found = asyncio.run(rounds())
        assert found == [[False] * WORKERS] * 5
    finally:
        provided.stop()
