"""The async SQLite store runs a claim and a completion each in one hop to aiosqlite's thread (`Statements` steps,
`execution.aio.statements_async`), on a real aiosqlite connection: hops counted, effects counted in the database, and
a task cancelled while its hop waits for the write lock leaves nothing behind."""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

# SQLAlchemy's asyncio layer needs greenlet; these tests run on aiosqlite: the [async] and [aiosqlite] extras.
pytest.importorskip("greenlet", reason="greenlet is not installed (pip install 'idem-dialects[async]')")
pytest.importorskip("aiosqlite", reason="aiosqlite is not installed (pip install 'idem-dialects[aiosqlite]')")

import aiosqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from idem_dialects.aio import AsyncIdempotencyStore
from idem_dialects.drivers.aiosqlite import PINNED
from idem_dialects.steps import Exec, Flow, Shape, Statement, statements


def test_aiosqlite_names_the_store_uses_exist(tmp_path: Path) -> None:
    async def main() -> None:
        async with aiosqlite.connect(tmp_path / "pin.db") as conn:
            for name in PINNED:
                assert hasattr(conn, name), f"aiosqlite.Connection has no {name} any more"

    asyncio.run(main())


class Hops:
    """Results aiosqlite's thread hands back to the loop (each one hop), counted."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.count = 0
        original = loop.call_soon_threadsafe

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]


class Effect:
    """A request's effect (its key into `effects`), noting the hops from its making to its start, and when it ended."""

    def __init__(self, hops: Hops, key: str) -> None:
        self.hops, self.key, self.made, self.before, self.ended = hops, key, hops.count, -1, -1

    async def __call__(self, conn: AsyncConnection) -> Any:
        self.before = self.hops.count - self.made
        await conn.execute(text("INSERT INTO effects VALUES (:k)"), {"k": self.key})
        self.ended = self.hops.count
        return {"key": self.key}


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite+aiosqlite:///{tmp_path / 'hops.db'}"


async def _store(url: str) -> AsyncIdempotencyStore:
    store = AsyncIdempotencyStore.from_url(url, table_prefix="hop_")
    await store.create_tables()
    async with store.engine.begin() as conn:
        await conn.execute(text("CREATE TABLE IF NOT EXISTS effects (k TEXT)"))
    return store


async def _effects(store: AsyncIdempotencyStore) -> dict[str, int]:
    async with store.engine.connect() as conn:
        rows = (await conn.execute(text("SELECT k, count(*) FROM effects GROUP BY k"))).all()
    return {str(k): int(n) for k, n in rows}


@pytest.mark.parametrize("one_hop", [True, False], ids=["one-hop", "per-statement"])
def test_claim_and_completion_take_one_hop_each(url: str, one_hop: bool) -> None:
    """Hops before the effect and after it, first-time runs: the transaction's BEGIN and the claim's four statements
    (the read, ROLLBACK, BEGIN IMMEDIATE, the INSERT) take one hop, the completion one; sent one by one (the same
    store with its `Statements` steps off) each takes its own. A replay is two: BEGIN and the read, the COMMIT."""

    async def main() -> tuple[list[int], list[int], list[int], list[str]]:
        store = await _store(url)
        statements: list[str] = []
        store._hook = lambda sql, done: None if done else statements.append(sql.split()[0])
        if not one_hop:
            store._statements = None
        hops = Hops(asyncio.get_running_loop())
        before: list[int] = []
        after: list[int] = []
        replays: list[int] = []
        for i in range(3):
            effect = Effect(hops, f"k{i}")
            result = await store.run(scope="s", operation="op", key=f"k{i}", request={"i": i}, effect=effect)
            assert not result.replayed
            before.append(effect.before)
            after.append(hops.count - effect.ended)
            start = hops.count
            replay = await store.run(scope="s", operation="op", key=f"k{i}", request={"i": i}, effect=effect)
            assert replay.replayed and replay.response == {"key": f"k{i}"}
            replays.append(hops.count - start)
        assert await _effects(store) == {"k0": 1, "k1": 1, "k2": 1}
        await store.close()
        return before, after, replays, statements

    before, after, replays, statements = asyncio.run(main())
    assert statements[:6] == ["BEGIN", "SELECT", "ROLLBACK", "BEGIN", "INSERT", "UPDATE"]  # told to the hook alike
    # After the effect: the completion, SQLAlchemy's COMMIT (the pool of the store's own engine rolls back on return
    # only a connection in a transaction).
    assert before == ([1] if one_hop else [1 + 4]) * 3
    assert after == [1 + 1] * 3
    assert replays == ([1 + 1] if one_hop else [1 + 1 + 1]) * 3


def test_a_sharded_request_takes_its_shards_hops(tmp_path: Path) -> None:
    """On aiosqlite shards a request takes the hops its shard's own store takes: one before the effect (the BEGIN
    in the claim's), the completion and COMMIT after it; so does a claim in a transaction the sharded store opens
    (the HTTP layer's: `transaction(claims.claim(...), Begin.CLAIM)`): BEGIN and claim in one hop, then COMMIT.
    Effects counted on each shard."""
    from idem_dialects.sharding import AsyncShardedStore
    from idem_dialects.steps import Begin, transaction

    async def main() -> tuple[list[int], list[int], list[int], list[dict[str, int]]]:
        urls = {name: f"sqlite+aiosqlite:///{tmp_path / f'{name}.db'}" for name in ("a", "b")}
        async with AsyncShardedStore.from_urls(urls, table_prefix="hop_") as sharded:
            await sharded.create_tables()
            for store in sharded.shards.values():
                async with store.engine.begin() as conn:
                    await conn.execute(text("CREATE TABLE effects (k TEXT)"))
            hops = Hops(asyncio.get_running_loop())
            before: list[int] = []
            after: list[int] = []
            claims: list[int] = []
            for i in range(8):
                effect = Effect(hops, f"k{i}")
                result = await sharded.run(scope=f"s{i}", operation="op", key=f"k{i}", request={}, effect=effect)
                assert not result.replayed
                before.append(effect.before)
                after.append(hops.count - effect.ended)
                start = hops.count
                req = sharded.claims.request(f"s{i}", "op", f"c{i}", {})
                outcome = await sharded.drive(transaction(sharded.claims.claim(req, fresh=True), Begin.CLAIM))
                assert type(outcome).__name__ == "Claimed"
                claims.append(hops.count - start)
            return before, after, claims, [await _effects(store) for store in sharded.shards.values()]  # type: ignore[arg-type]

    before, after, claims, per_shard = asyncio.run(main())
    assert before == [1] * 8 and after == [1 + 1] * 8
    assert claims == [1 + 1] * 8
    assert all(per_shard) and sum(map(Counter, per_shard), Counter()) == {f"k{i}": 1 for i in range(8)}


def test_task_cancelled_while_its_hop_waits_for_the_lock(url: str, tmp_path: Path) -> None:
    """Another connection holds SQLite's write lock, so the claim's BEGIN IMMEDIATE waits in aiosqlite's thread
    (busy timeout 5 s). Cancelled, the task ends once the hop is back (SQLite's busy wait does not heed
    sqlite3_interrupt: the busy timeout at most, as when each statement was its own hop), the connection goes back to
    the pool outside any transaction, and the key, re-sent once the lock is free, runs its effect once."""

    async def main() -> None:
        store = await _store(url)
        effect_calls = 0

        async def effect(conn: AsyncConnection) -> Any:
            nonlocal effect_calls
            effect_calls += 1
            await conn.execute(text("INSERT INTO effects VALUES ('k')"))
            return {"ok": True}

        await store.run(scope="s", operation="op", key="warm", request={}, effect=effect)
        holder = sqlite3.connect(tmp_path / "hops.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        task = asyncio.create_task(store.run(scope="s", operation="op", key="k", request={}, effect=effect))
        await asyncio.sleep(0.3)  # the claim's hop is waiting for the lock by now
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task  # once the hop is back: at most the busy timeout (not timed here: a loaded machine is slower)
        assert store.engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        holder.execute("ROLLBACK")
        holder.close()
        result = await store.run(scope="s", operation="op", key="k", request={}, effect=effect)
        assert not result.replayed and effect_calls == 2
        assert await _effects(store) == {"k": 2}  # the warm-up's row and k's one
        async with store.engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            assert raw is not None and not raw.in_transaction  # type: ignore[attr-defined]
        await store.close()

    asyncio.run(main())


def test_a_failing_statement_ends_the_hop_and_the_loop_runs_the_rest(url: str) -> None:
    """A statement failing in the hop comes back wrapped as SQLAlchemy wraps a statement's error, thrown into the flow
    where it yielded that statement, in the flow's context; what the flow does after it runs statement by statement
    in the store's own loop (`drive`), told to the hook in order, and what the flow set in its context stays there."""
    seen: ContextVar[str] = ContextVar("seen", default="")
    bad = Statement(text("INSERT INTO missing VALUES (1)"), Shape.NOTHING)
    good = Statement(text("SELECT 1"), Shape.ROW)

    def body() -> Flow[tuple[str, tuple[Any, ...], str]]:
        token = seen.set("in the flow")
        try:
            try:
                yield Exec(bad, {})
                raise AssertionError("the INSERT into a missing table went through")
            except DBAPIError as error:
                caught = type(error).__name__
            row = yield Exec(good, {})
            return caught, tuple(row), seen.get()
        finally:
            seen.reset(token)

    async def main() -> tuple[tuple[str, tuple[Any, ...], str], list[tuple[str, bool]], str]:
        store = await _store(url)
        told: list[tuple[str, bool]] = []
        async with store.transaction() as conn:
            store._hook = lambda sql, done: told.append((sql.split()[0], done))
            result = await store.drive(statements(body()), conn)
        await store.close()
        return result, told, seen.get()

    result, told, after = asyncio.run(main())
    assert result == ("OperationalError", (1,), "in the flow")
    assert told == [("INSERT", False), ("SELECT", False), ("SELECT", True)]
    assert after == ""


def test_own_engine_rolls_back_on_return_only_what_is_in_a_transaction(url: str) -> None:
    """The pool of an engine the store made rolls a connection back on return only if it is in a transaction (its
    rollback is a hop even when there is nothing to roll back): a transaction begun behind SQLAlchemy's back is still
    rolled back, and a caller's pool_reset_on_return is kept."""

    async def main() -> None:
        store = await _store(url)
        async with store.engine.connect() as conn:
            await conn.execute(text("INSERT INTO effects VALUES ('kept')"))
            await conn.commit()
            raw = (await conn.get_raw_connection()).driver_connection
            assert raw is not None
            await raw.execute("BEGIN")  # SQLAlchemy holds no transaction: only the pool's reset can end this one
            await raw.execute("INSERT INTO effects VALUES ('behind')")
        hops = Hops(asyncio.get_running_loop())
        async with store.engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            assert raw is not None and not raw.in_transaction and raw.isolation_level == ""  # type: ignore[attr-defined]
            before = hops.count
        assert hops.count == before  # returned outside a transaction: no rollback sent
        assert await _effects(store) == {"kept": 1}
        await store.close()

        chosen = AsyncIdempotencyStore.from_url(url, table_prefix="hop_", pool_reset_on_return="commit")
        async with chosen.engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            assert raw is not None
            await raw.execute("BEGIN")
            await raw.execute("INSERT INTO effects VALUES ('committed')")
        assert await _effects(chosen) == {"committed": 1, "kept": 1}
        await chosen.close()

    asyncio.run(main())
