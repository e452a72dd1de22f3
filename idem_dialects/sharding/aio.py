"""AsyncShardedStore: `ShardedStore` for asyncio code, each shard an AsyncIdempotencyStore (the routing, the claim
and outbox flows are the sync store's, `routing.py`; only this loop awaits)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from sqlalchemy.engine import URL

from ..aio import AsyncIdempotencyStore, AsyncStore
from ..api import AsyncStoreAPI
from ..core import NO_PAYLOAD
from ..execution.aio import to_completion
from ..heartbeat import beating_async
from ..ids import Identity, Origin
from ..limits import DEFAULT_PACE, OnInFlight
from ..outcomes import Claimed, Delivery, Disposition, OnMismatch, Outcome, Result
from ..retention import Stats
from ..retry import RetryPolicy
from ..steps import Begin, Effect, Flow, Sleep, Step, Stepper, Transaction
from ..storebase import refuse_sync_effect
from .moving import MoveReport, move_records
from .onshard import OnShard
from .placement import ShardChooser
from .routing import CrossShard, Sharded, crossing, from_urls, owner

T = TypeVar("T")
AsyncEffect = Callable[[Any], Awaitable[Any]]


class _Pending:
    """A transaction opened on the shard of its first routed step (the async loop's)."""

    def __init__(self, begin: Begin, stack: AsyncExitStack) -> None:
        self.begin, self.stack = begin, stack
        self.shard: str | None = None
        self.connection: Any = None

    async def on(self, shard: str, store: AsyncStore[Any], body: Flow[T]) -> tuple[Any, Flow[T]]:
        """The transaction's connection on `shard`, and `body` to drive on it: the first routed step opens the
        connection and its body begins the transaction (as the shard's own store begins it, `AsyncStore.begun`)."""
        if self.shard is None:
            self.connection = await self.stack.enter_async_context(store.executor.transaction(self.begin))
            self.shard = shard
            return self.connection, store.begun(self.begin, body)
        if shard != self.shard:
            raise crossing(self.shard, shard)
        return self.connection, body


def _dispose(store: AsyncStore[Any]) -> None:
    """A store `from_urls` made but will not hand out: its engine never connected, so disposing needs no await."""
    store.engine.sync_engine.dispose()


class AsyncShardedStore(Sharded[AsyncStore[Any]]):
    """`ShardedStore`'s API, awaited: `shards` maps ids to AsyncIdempotencyStores, `shard_chooser(scope)` picks one."""

    needs = "an AsyncShardedStore"

    @classmethod
    def from_urls(cls, urls: Mapping[str, str | URL], *, shard_chooser: ShardChooser | None = None,
                  **options: Any) -> AsyncShardedStore:
        """One AsyncIdempotencyStore per URL (`options` go to each `from_url`); `await close()` closes them."""
        sharded = cls(from_urls(lambda url: AsyncIdempotencyStore.from_url(url, **options), _dispose, urls),
                      shard_chooser)
        sharded._owned = True
        return sharded

    # --- schema and retention: every shard ---------------------------------------------------------------------

    async def create_tables(self, *, generations: bool = False) -> None:
        for store in self.shards.values():
            await store.create_tables(generations=generations)

    async def drop_tables(self) -> None:
        for store in self.shards.values():
            await store.drop_tables()

    async def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
                    progress: Callable[[str, int], None] | None = None, pace: float = DEFAULT_PACE) -> int:
        """Each shard's purge in turn; the rows deleted on all of them."""
        return sum([await store.purge(older_than, batch_size, progress, pace) for store in self.shards.values()])

    async def stats(self) -> Stats:
        """Every shard's `stats` as one (`Stats.combined`), each shard's own in `.shards`."""
        return Stats.combined({shard: await store.stats() for shard, store in self.shards.items()})

    # --- the protocol, on the scope's shard ----------------------------------------------------------------------

    def transaction(self, *, scope: str | None = None) -> AbstractAsyncContextManager[Any]:
        """A transaction on the shard of `scope`, for the step-by-step API."""
        return self._routed(scope, "transaction()").transaction()

    async def claim(self, conn: Any, *, scope: str, operation: str, key: str, request: Any,
                    lease: timedelta | None = None) -> Outcome:
        """On the shard of `scope`, whose connection `conn` must be; while the chooser moves the scope, a key its old
        shard recorded is answered from there."""
        store = self._owner(conn, scope)
        found = await self.drive(self._looked_up(scope, operation, key, request, lease))
        if found is not None:
            return found
        return await store.claim(conn, scope=scope, operation=operation, key=key, request=request, lease=lease)

    async def complete(self, conn: Any, claimed: Claimed, response: Any, status: int = 200) -> None:
        await self._owner(conn, claimed.scope).complete(conn, claimed, response, status)

    async def release(self, conn: Any, claimed: Claimed) -> bool:
        return await self._owner(conn, claimed.scope).release(conn, claimed)

    async def accept_message(self, conn: Any, *, subscriber: str, message_id: str, payload: Any = NO_PAYLOAD) -> bool:
        """On the shard `conn` belongs to: the message is recorded where the handler's writes commit."""
        return await self._owner(conn).accept_message(conn, subscriber=subscriber, message_id=message_id,
                                                      payload=payload)

    async def add_command(self, conn: Any, destination: str, payload: Any, headers: Mapping[str, str] | None = None,
                          *, scope: str | None = None, origin: Identity | Origin | None = None,
                          sequence: int | None = None) -> str:
        """On the shard `conn` belongs to (see the sync `ShardedStore.add_command`)."""
        return await self._owner(conn).add_command(conn, destination, payload, headers, scope=scope, origin=origin,
                                                   sequence=sequence)

    async def consume(self, *, subscriber: str, message_id: str, handler: AsyncEffect, payload: Any = NO_PAYLOAD,
                      on_mismatch: OnMismatch = Disposition.DEAD_LETTER, retry: RetryPolicy | None = None,
                      scope: str | None = None) -> Delivery:
        """`consume` on the shard of `scope`: the owner of what the handler writes (a message names no scope)."""
        flow = self._consuming(scope, subscriber, message_id, payload, on_mismatch, retry)
        refuse_sync_effect(handler, "handler")
        return await self.drive(flow, effect=handler)

    async def run(self, *, scope: str, operation: str, key: str, request: Any, effect: AsyncEffect,
                  status: int = 200, lease: timedelta | None = None, retry: RetryPolicy | None = None,
                  on_in_flight: OnInFlight = "wait") -> Result:
        """`run` on the shard of `scope`: `effect` gets that shard's connection."""
        flow = self.claims.run(scope=scope, operation=operation, key=key, request=request, status=status,
                               lease=lease, retry=retry, on_in_flight=on_in_flight)  # validated before any SQL
        refuse_sync_effect(effect)
        return await self.drive(flow, effect=effect)

    # --- changing the placement -----------------------------------------------------------------------------------

    async def move_records(self, *, batch_size: int = 500, wait: timedelta = timedelta(minutes=5),
                           poll: float = 1.0) -> MoveReport:
        """While the chooser is a `Move`: copy every moving scope's completed records from its old shard to its new
        one, mark its abandoned claims moved, and wait (up to `wait`, looking every `poll` seconds) for its live
        claims there to end; then copy the processed messages of each shard that loses scopes to the shards that
        gain them. Run it once every process routes with the `Move`; once `done`, the store may route by `after`
        alone. Safe to run again (what is there already is kept). See docs: Scaling out."""
        return await self.drive(move_records(self.claims, batch_size, wait, poll))

    # --- the loop adapters drive `claims` and `outbox` with -------------------------------------------------------

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
            if step.alone:
                return await store.drive(step.body, None, effect)
            if isinstance(conn, _Pending):
                held, flow = await conn.on(step.shard, store, step.body)
                return await store.drive(flow, held, effect)
            if conn is not None:
                found = owner(self.shards, conn)
                if found != step.shard:
                    raise crossing(found, step.shard)
            return await store.drive(step.body, conn, effect)
        if isinstance(step, Transaction):
            body = self._in_transaction(step, effect)
            return await (to_completion(body) if step.shielded else body)
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

    # --- lifecycle -------------------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the shards' stores if `from_urls` made them."""
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


if TYPE_CHECKING:  # mypy holds each class against its declared surface (api.py)
    def _surface(it: AsyncShardedStore) -> AsyncStoreAPI[Any]:
        return it
