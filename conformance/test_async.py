"""Checks of AsyncIdempotencyStore itself (async columns only): races under asyncio.gather, cancellation at every
step of run, and a claim after an earlier read, on each engine's async drivers.

Every other check also runs on the async store through the sync bridge (``--idem-api async|both``)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, event, func, insert, select
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

import idem_dialects
from idem_dialects import Claimed, Replayed, RequestInFlight, RetryPolicy, UnsupportedIsolation

from .plugin import EngineUnderTest, unique_prefix
from .support import StatementLog
from .test_isolation import KNOWN_LEVELS

if TYPE_CHECKING:  # at run time only the async columns load them: without greenlet ([async]) there are none
    from sqlalchemy.ext.asyncio import AsyncConnection

    from idem_dialects import AsyncIdempotencyStore

REQ = {"amount": 100}
Observe = Callable[[str, object], None]
# Not `pytestmark`: the suite carries each check function, never its module's marks (tests/test_suite_list.py).
async_only = pytest.mark.idem_api("async")


class AsyncEffects:
    """`<prefix>fx`: one row per effect that really ran, written on the effect's AsyncConnection."""

    def __init__(self, store: AsyncIdempotencyStore) -> None:
        self.store = store
        self.metadata = MetaData()
        self.table = Table(f"{store.table_prefix}fx", self.metadata, Column("id", String(32), primary_key=True),
                           Column("k", String(255), nullable=False), Column("amount", Integer, nullable=False))

    async def apply(self, conn: AsyncConnection, key: str) -> str:
        effect_id = uuid.uuid4().hex
        await conn.execute(insert(self.table).values(id=effect_id, k=key, amount=1))
        return effect_id

    async def per_key(self) -> dict[str, int]:
        async with self.store.engine.connect() as conn:
            rows = (await conn.execute(select(self.table.c.k, func.count()).group_by(self.table.c.k))).all()
        return {k: int(n) for k, n in rows}


@asynccontextmanager
async def async_store(idem_engine: EngineUnderTest, **options: Any) -> AsyncIterator[tuple[AsyncIdempotencyStore,
                                                                                           AsyncEffects]]:
    """An async store and its effects table on fresh tables, dropped (and the engine disposed) on exit."""
    store_from_url = idem_dialects.AsyncIdempotencyStore.from_url
    async with store_from_url(idem_engine.url, table_prefix=unique_prefix(), **options) as store:
        effects = AsyncEffects(store)
        await store.create_tables()
        async with store.engine.begin() as conn:
            await conn.run_sync(effects.metadata.create_all)
        try:
            yield store, effects
        finally:
            async with store.engine.begin() as conn:
                await conn.run_sync(effects.metadata.drop_all)
            await store.drop_tables()


@pytest.mark.idem_stack
@async_only
@pytest.mark.idem_requires("concurrent_connections")
def test_async_same_key_gather_race(idem_engine: EngineUnderTest, idem_observe: Observe) -> None:
    """50 concurrent runs of one key under asyncio.gather (each on its own pooled connection): exactly one effect
    runs, and every other caller replays its response."""

    async def main() -> None:
        async with async_store(idem_engine, pool_size=10, max_overflow=40) as (store, effects):
            async def effect(conn: AsyncConnection) -> Any:
                response = {"effect": await effects.apply(conn, "k")}
                await asyncio.sleep(0.05)  # hold the claim while the others arrive
                return response

            results = await asyncio.gather(*(store.run(scope="s", operation="op", key="k", request=REQ,
                                                       effect=effect) for _ in range(50)))
            assert await effects.per_key() == {"k": 1}
            assert sum(not r.replayed for r in results) == 1
            assert len({r.response["effect"] for r in results}) == 1, "a caller got another response"
            retries = ", ".join(f"{c} x{n}" for c, n in sorted(store.retries.items())) or "no retries"
            idem_observe("50 same-key async runs", f"1 effect, 49 replays ({retries})")

    asyncio.run(main())


STEPS = ["after-claim", "in-effect", "during-complete", "during-commit", "timeout"]
# The attempt's task, seen also from tasks it starts: a store may end a transaction in a task of its own, which the
# attempt's cancellation does not interrupt (SQLAlchemy's close does so too), so `current_task()` may be another.
ATTEMPT: contextvars.ContextVar[asyncio.Task[Any] | None] = contextvars.ContextVar("attempt", default=None)


@pytest.mark.idem_stack
@async_only
@pytest.mark.parametrize("mode", ["atomic", "leased"])
@pytest.mark.parametrize("step", STEPS)
def test_cancelled_run_leaves_key_free(idem_engine: EngineUnderTest, step: str, mode: str,
                                       idem_observe: Observe) -> None:
    """A run whose task is cancelled (or times out under asyncio.timeout) after its claim, inside its effect,
    during complete or during the commit leaves no claim blocking the key beyond its lease: re-sent, each key
    runs its effect exactly once (or replays the committed one), and no pooled connection is left checked out."""
    lease = timedelta(seconds=1) if mode == "leased" else None
    keys = [f"{step}-{i}" for i in range(3)]

    async def main() -> None:
        statements = StatementLog()
        async with async_store(idem_engine, statement_hook=statements) as (store, effects):
            records = store.tables.records.name
            armed: set[str] = set()

            def trigger(statement: str, done: bool) -> None:
                if done is (step == "during-complete"):
                    return
                text = statement.lstrip().upper()
                # The claim: an INSERT, or (PostgreSQL's claim) the CTE that wraps it.
                hit = ((step == "after-claim" and text.startswith(("INSERT", "WITH INS")) and records.upper() in text)
                       or (step == "during-complete" and text.startswith("UPDATE") and records.upper() in text))
                if hit and (task := ATTEMPT.get()) is not None and task.get_name() in armed:
                    armed.discard(task.get_name())
                    task.cancel()

            def on_commit(conn: Any) -> None:
                task = ATTEMPT.get()
                name = task.get_name() if task is not None else ""
                if step == "during-commit" and task is not None and name in armed and name in effect_ran:
                    armed.discard(task.get_name())
                    task.cancel()

            sync_engine = store.engine.sync_engine
            # after the claim's INSERT ran; before the complete's UPDATE ran (so that statement's await is cancelled)
            statements.then = trigger
            event.listen(sync_engine, "commit", on_commit)
            started = asyncio.Event()
            effect_ran: set[str] = set()  # tasks whose effect ran: their next commit is the effect's

            async def attempt(key: str) -> None:
                ATTEMPT.set(asyncio.current_task())

                async def effect(conn: AsyncConnection) -> Any:
                    response = {"effect": await effects.apply(conn, key)}
                    task = asyncio.current_task()
                    effect_ran.add(task.get_name() if task is not None else "")
                    if step in ("in-effect", "timeout"):
                        started.set()
                        await asyncio.sleep(30)
                    return response

                if step == "timeout":
                    async with asyncio.timeout(0.3):
                        await store.run(scope="s", operation="op", key=key, request=REQ, effect=effect, lease=lease)
                else:
                    await store.run(scope="s", operation="op", key=key, request=REQ, effect=effect, lease=lease)

            tasks = []
            for key in keys:
                task = asyncio.create_task(attempt(key), name=f"attempt-{key}")
                armed.add(task.get_name())
                tasks.append(task)
            if step == "in-effect":
                await started.wait()
                await asyncio.sleep(0.05)
                for task in tasks:
                    task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            interrupted = [type(o).__name__ for o in outcomes if isinstance(o, BaseException)]
            assert interrupted, "no attempt was interrupted: the check did not test cancellation"
            for o in outcomes:
                if isinstance(o, BaseException) and not isinstance(o, asyncio.CancelledError | TimeoutError):
                    raise o
            statements.then = None
            event.remove(sync_engine, "commit", on_commit)

            replays = 0
            for key in keys:
                result = await resend(store, key, effects, lease)
                replays += result.replayed
            assert await effects.per_key() == dict.fromkeys(keys, 1)
            assert checked_out(store) == 0, "a cancelled run kept a connection checked out"
            idem_observe(f"cancelled {step} ({mode})", f"{len(interrupted)} interrupted; re-sent: {replays} replayed,"
                                                  f" {len(keys) - replays} ran")

    asyncio.run(main())


def checked_out(store: AsyncIdempotencyStore) -> int:
    """Connections the store's pool has handed out and not had back."""
    pool: Any = store.engine.sync_engine.pool  # a QueuePool (StaticPool for :memory:, which has no count)
    return int(pool.checkedout()) if hasattr(pool, "checkedout") else 0


async def resend(store: AsyncIdempotencyStore, key: str, effects: AsyncEffects, lease: timedelta | None) -> Any:
    """Re-send a request until it completes; InFlight is acceptable only while a leased claim's lease lasts (the
    database's clock, which its `retry_after` reads, says how long the claim still holds)."""

    async def effect(conn: AsyncConnection) -> Any:
        return {"effect": await effects.apply(conn, key)}

    while True:
        try:
            return await store.run(scope="s", operation="op", key=key, request=REQ, effect=effect,
                                   retry=RetryPolicy(total=5))
        except RequestInFlight as busy:
            assert lease is not None and busy.retry_after <= lease.total_seconds(), \
                f"key {key!r} blocked for {busy.retry_after:.1f} s more, past its lease ({lease})"
            await asyncio.sleep(busy.retry_after + 0.05)


@pytest.mark.idem_stack
@async_only
@pytest.mark.idem_requires("concurrent_connections")
def test_async_claim_after_earlier_read_sees_winner(idem_engine: EngineUnderTest) -> None:
    """On the async driver, a transaction that read before the winner committed still sees the winner when it
    claims: it replays or gets a retryable error that run absorbs - never a second effect (where claims are not
    exclusive before commit, the claim may succeed and its commit fails retryably instead), as the sync check."""

    async def main() -> None:
        async with async_store(idem_engine) as (store, effects):
            async with store.engine.connect() as reader:
                await reader.begin()
                await reader.execute(select(store.tables.records))  # a snapshot on MVCC engines
                first = await store.run(scope="s", operation="op", key="k", request=REQ,
                                        effect=functools.partial(_applied, effects))
                try:
                    outcome = await store.claim(reader, scope="s", operation="op", key="k", request=REQ)
                    if isinstance(outcome, Claimed) and not store.features.exclusive_claim:
                        # A multi-primary node (Galera) waits for other nodes' commits only at a transaction's first
                        # statement, so this claim may not see the winner yet; certification then rejects its commit.
                        await store.complete(reader, outcome, await _applied(effects, reader))
                        with pytest.raises(DBAPIError) as rejected:
                            await reader.commit()
                        assert store.retry_cause(rejected.value) is not None, f"not retryable: {rejected.value!r}"
                    else:
                        assert isinstance(outcome, Replayed) and outcome.response == first.response, outcome
                    # Inside the try: Galera answers the ROLLBACK of a transaction it aborted (the winner's write set
                    # met this one's claim) with 1213, a retryable error like any other here.
                    await reader.rollback()
                except Exception as exc:
                    assert store.retry_cause(exc) is not None, f"not retryable: {exc!r}"
            again = await store.run(scope="s", operation="op", key="k", request=REQ,
                                    effect=functools.partial(_applied, effects))
            assert again.replayed and await effects.per_key() == {"k": 1}

    asyncio.run(main())


async def _applied(effects: AsyncEffects, conn: AsyncConnection) -> Any:
    return {"effect": await effects.apply(conn, "k")}


@async_only
def test_async_driver_errors_classified_by_code(idem_engine: EngineUnderTest, idem_observe: Observe) -> None:
    """The async driver's duplicate-key error is classified as a duplicate by the backend (by error code), its
    NOT NULL violation is not, and neither is retryable - the same classification code as the sync driver's."""

    async def main() -> None:
        async with async_store(idem_engine) as (store, effects):
            table = effects.table
            async with store.engine.begin() as conn:
                await conn.execute(insert(table).values(id="a" * 32, k="k", amount=1))
            seen: dict[str, Any] = {}
            rows: list[tuple[str, dict[str, Any]]] = [("duplicate", {"id": "a" * 32, "k": "k", "amount": 1}),
                                                      ("not null", {"id": "b" * 32, "k": "k", "amount": None})]
            for what, row in rows:
                with pytest.raises(IntegrityError) as err:
                    async with store.engine.begin() as conn:
                        await conn.execute(insert(table).values(**row))
                seen[what] = err.value
                idem_observe(f"async driver: {what} surfaces as", f"{type(err.value.orig).__module__.split('.')[0]}"
                                                             f" {type(err.value.orig).__name__}")
            assert store.backend.errors.is_duplicate(seen["duplicate"])
            assert not store.backend.errors.is_duplicate(seen["not null"])
            assert store.retry_cause(seen["duplicate"]) is None and store.retry_cause(seen["not null"]) is None

    asyncio.run(main())


@async_only
def test_async_undeclared_isolation_refused_before_sql(idem_engine: EngineUnderTest,
                                                       idem_observe: Observe) -> None:
    """AsyncIdempotencyStore refuses an AsyncEngine configured with AUTOCOMMIT or an isolation level the backend
    does not declare, and a claim on a connection switched to one, with UnsupportedIsolation - before any SQL."""
    declared = idem_engine.features.isolation_levels
    refused = [level for level in KNOWN_LEVELS if level not in declared]
    assert "AUTOCOMMIT" in refused

    from sqlalchemy.ext.asyncio import create_async_engine

    async def main() -> None:
        for level in refused:
            engine = create_async_engine(idem_engine.url, isolation_level=level)
            connects: list[object] = []
            event.listen(engine.sync_engine, "connect",
                         lambda dbapi_conn, record, seen=connects: seen.append(dbapi_conn))
            try:
                with pytest.raises(UnsupportedIsolation) as err:
                    idem_dialects.AsyncIdempotencyStore(engine)
            finally:
                await engine.dispose()
            assert (err.value.level, err.value.supported) == (level, tuple(declared)) and connects == []
            with pytest.raises(UnsupportedIsolation):
                idem_dialects.AsyncIdempotencyStore.from_url(idem_engine.url, isolation_level=level)
        statements = StatementLog()
        async with async_store(idem_engine, statement_hook=statements) as (store, _):
            statements.sql.clear()
            async with store.engine.connect() as conn:
                auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
                with pytest.raises(UnsupportedIsolation):
                    await store.claim(auto, scope="s", operation="op", key="k", request=REQ)
            assert statements.sql == [], "the claim ran SQL before refusing AUTOCOMMIT"
        idem_observe("async: isolation levels refused", ", ".join(refused))

    asyncio.run(main())


@async_only
def test_async_leased_claim_commit_reply_lost_continues_as_owner(idem_engine: EngineUnderTest) -> None:
    """An async leased run whose claim COMMIT went through but whose reply was lost retries, finds its own claim
    token on the in-flight record and carries on as the owner: the run completes and the effect ran once."""

    async def main() -> None:
        async with async_store(idem_engine) as (store, effects):
            real = store.executor.transaction  # every transaction the store's loop opens
            lost: list[bool] = []

            @asynccontextmanager
            async def reply_lost_once(begin: Any) -> AsyncIterator[AsyncConnection]:
                async with real(begin) as conn:
                    yield conn
                if not lost:  # the first transaction (the claim) committed; its reply "never arrived"
                    lost.append(True)
                    raise OperationalError("COMMIT", {}, ConnectionError("server closed the connection"),
                                           connection_invalidated=True)

            store.executor.transaction = reply_lost_once  # type: ignore[method-assign]
            effect = functools.partial(_applied, effects)
            result = await store.run(scope="s", operation="op", key="k", request=REQ, effect=effect,
                                     lease=timedelta(seconds=30), retry=RetryPolicy(total=5))
            assert lost and not result.replayed and await effects.per_key() == {"k": 1}
            again = await store.run(scope="s", operation="op", key="k", request=REQ, effect=effect,
                                    lease=timedelta(seconds=30))
            assert again.replayed and again.response == result.response and await effects.per_key() == {"k": 1}

    asyncio.run(main())
