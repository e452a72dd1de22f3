"""AsyncShardedStore: `ShardedStore` for asyncio code, each shard an AsyncIdempotencyStore (the routing and the
claim flows are the sync store's, `routing.py`; only this loop awaits)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from datetime import timedelta
from types import TracebackType
from typing import Any, Self, TypeVar

from sqlalchemy.engine import URL

from ..aio import AsyncIdempotencyStore
from ..core import NO_PAYLOAD
from ..heartbeat import beating_async
from ..inbox import OnMismatch
from ..limits import OnInFlight
from ..outcomes import Claimed, Delivery, Disposition, Outcome, Result
from ..retention import Stats
from ..retry import RetryPolicy
from ..steps import Begin, Effect, Flow, Sleep, Step, Stepper, Transaction
from .routing import CrossShard, OnShard, ShardChooser, Sharded, crossing
from .sync import checked_owner, owner

T = TypeVar("T")
AsyncEffect = Callable[[Any], Awaitable[Any]]


class _Pending:
    """A transaction opened on the shard of its first routed step (the async loop's)."""

    def __init__(self, begin: Begin, stack: AsyncExitStack) -> None:
        self.begin, self.stack = begin, stack
        self.shard: str | None = None
        self.connection: Any = None

    async def on(self, shard: str, store: AsyncIdempotencyStore) -> Any:
        if self.shard is None:
            self.connection = await self.stack.enter_async_context(store._transaction(self.begin))
            self.shard = shard
        elif shard != self.shard:
            raise crossing(self.shard, shard)
        return self.connection


class AsyncShardedStore(Sharded[AsyncIdempotencyStore]):
    """`ShardedStore`'s API, awaited: `shards` maps ids to AsyncIdempotencyStores, `shard_chooser(scope)` picks one."""

    needs = "an AsyncShardedStore"

    @classmethod
    def from_urls(cls, urls: Mapping[str, str | URL], *, shard_chooser: ShardChooser,
                  **options: Any) -> AsyncShardedStore:
        """One AsyncIdempotencyStore per URL (`options` go to each `from_url`); `await close()` closes them."""
        store = cls({shard: AsyncIdempotencyStore.from_url(url, **options) for shard, url in urls.items()},
                    shard_chooser)
        store._owned = True
        return store

    async def create_tables(self, *, generations: bool = False) -> None:
        for store in self.shards.values():
            await store.create_tables(generations=generations)

    async def drop_tables(self) -> None:
        for store in self.shards.values():
            await store.drop_tables()

    async def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
                    progress: Callable[[str, int], None] | None = None) -> int:
        return sum([await store.purge(older_than, batch_size, progress) for store in self.shards.values()])

    async def stats(self) -> dict[str, Stats]:
        return {shard: await store.stats() for shard, store in self.shards.items()}

    def transaction(self, *, scope: str) -> AbstractAsyncContextManager[Any]:
        return self.store_for(scope).transaction()

    async def claim(self, conn: Any, *, scope: str, operation: str, key: str, request: Any,
                    lease: timedelta | None = None) -> Outcome:
        shard = checked_owner(self.shards, self.shard_chooser, conn, scope)
        return await self.shards[shard].claim(conn, scope=scope, operation=operation, key=key, request=request,
                                              lease=lease)

    async def complete(self, conn: Any, claimed: Claimed, response: Any, status: int = 200) -> None:
        shard = checked_owner(self.shards, self.shard_chooser, conn, claimed.scope)
        await self.shards[shard].complete(conn, claimed, response, status)

    async def release(self, conn: Any, claimed: Claimed) -> bool:
        shard = checked_owner(self.shards, self.shard_chooser, conn, claimed.scope)
        return await self.shards[shard].release(conn, claimed)

    async def accept_message(self, conn: Any, *, subscriber: str, message_id: str,
                             payload: Any = NO_PAYLOAD) -> bool:
        return await self.shards[owner(self.shards, conn)].accept_message(
            conn, subscriber=subscriber, message_id=message_id, payload=payload)

    async def consume(self, *, subscriber: str, message_id: str, handler: AsyncEffect, scope: str,
                      payload: Any = NO_PAYLOAD, on_mismatch: OnMismatch = Disposition.DEAD_LETTER,
                      retry: RetryPolicy | None = None) -> Delivery:
        return await self.store_for(scope).consume(subscriber=subscriber, message_id=message_id, handler=handler,
                                                   payload=payload, on_mismatch=on_mismatch, retry=retry)

    async def run(self, *, scope: str, operation: str, key: str, request: Any, effect: AsyncEffect,
                  status: int = 200, lease: timedelta | None = None, retry: RetryPolicy | None = None,
                  on_in_flight: OnInFlight = "wait") -> Result:
        return await self.store_for(scope).run(scope=scope, operation=operation, key=key, request=request,
                                               effect=effect, status=status, lease=lease, retry=retry,
                                               on_in_flight=on_in_flight)

    async def drive(self, flow: Flow[T], conn: Any = None, effect: AsyncEffect | None = None) -> T:
        stepper = Stepper(flow)
        while (step := stepper.next()) is not None:
            try:
                stepper.send(await self._step(step, conn, effect))
            except BaseException as exc:
                stepper.throw(exc)
        return stepper.value

    async def _step(self, step: Step | OnShard, conn: Any, effect: AsyncEffect | None) -> Any:
        if isinstance(step, OnShard):
            store = self.shards[step.shard]
            if isinstance(conn, _Pending):
                return await store.drive(step.body, await conn.on(step.shard, store), effect)
            if conn is not None:
                found = owner(self.shards, conn)
                if found != step.shard:
                    raise crossing(found, step.shard)
            return await store.drive(step.body, conn, effect)
        if isinstance(step, Transaction):
            body = self._in_transaction(step, effect)
            return await (asyncio.shield(body) if step.shielded else body)
        if isinstance(step, Effect):
            assert effect is not None, "a flow with an Effect step needs an effect"
            async with beating_async(step.heartbeat, self.drive):
                return await effect(conn.connection if isinstance(conn, _Pending) else conn)
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        raise CrossShard(f"{type(step).__name__} outside any shard: route it with the store's `claims`")

    async def _in_transaction(self, step: Transaction, effect: AsyncEffect | None) -> Any:
        async with AsyncExitStack() as stack:
            return await self.drive(step.body, _Pending(step.begin, stack), effect)

    async def close(self) -> None:
        if self._owned:
            for store in self.shards.values():
                await store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncShardedStore(shards={list(self.shards)!r})"
