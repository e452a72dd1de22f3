"""ShardedStore: one store over several databases, each scope's keys on the database its business data lives on.

Every protocol call goes to the store of its scope's shard (`shard_chooser(scope)`), which runs it in its own
transactions, so the effect gets that shard's connection and the record commits with it. Adapters (the HTTP layer,
the relays) drive flows built on `claims` and `outbox` through `drive`, which opens each transaction on the shard of
its first routed step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from sqlalchemy.engine import URL

from ..api import StoreAPI
from ..core import NO_PAYLOAD
from ..heartbeat import beating
from ..ids import Identity, Origin
from ..limits import DEFAULT_PACE, OnInFlight
from ..outcomes import Claimed, Delivery, Disposition, OnMismatch, Outcome, Result
from ..retention import Stats
from ..retry import RetryPolicy
from ..steps import Begin, Effect, Flow, Sleep, Step, Stepper, Transaction
from ..store import IdempotencyStore, SyncStore
from ..storebase import refuse_async_effect, refuse_awaitable
from .moving import MoveReport, move_records
from .onshard import OnShard
from .placement import ShardChooser
from .routing import CrossShard, Sharded, crossing, from_urls, owner

T = TypeVar("T")


class _Pending:
    """A transaction the sharded loop has been asked for, opened on the shard of its first routed step."""

    def __init__(self, begin: Begin, stack: ExitStack) -> None:
        self.begin, self.stack = begin, stack
        self.shard: str | None = None
        self.connection: Any = None

    def on(self, shard: str, store: SyncStore[Any], body: Flow[T]) -> tuple[Any, Flow[T]]:
        """The transaction's connection on `shard`, and `body` to drive on it: the first routed step opens the
        connection and its body begins the transaction (`SyncStore.begun`)."""
        if self.shard is None:
            self.connection = self.stack.enter_context(store.executor.transaction(self.begin))
            self.shard = shard
            return self.connection, store.begun(self.begin, body)
        if shard != self.shard:
            raise crossing(self.shard, shard)
        return self.connection, body


class ShardedStore(Sharded[SyncStore[Any]]):
    """`IdempotencyStore`'s API over several databases (`shards`: id -> a sync store, e.g. an IdempotencyStore or a
    DjangoStore per database alias), each key on the shard `shard_chooser(scope)` names. Each shard may be its own
    HA stack: one shard's outage or failover stops only the keys of its scopes. Thread-safe."""

    needs = "a ShardedStore"

    @classmethod
    def from_urls(cls, urls: Mapping[str, str | URL], *, shard_chooser: ShardChooser | None = None,
                  **options: Any) -> ShardedStore:
        """One IdempotencyStore per URL (`options` go to each `from_url`); `close()` closes them."""
        sharded = cls(from_urls(lambda url: IdempotencyStore.from_url(url, **options), SyncStore.close, urls),
                      shard_chooser)
        sharded._owned = True
        return sharded

    # --- schema and retention: every shard ---------------------------------------------------------------------

    def create_tables(self, *, generations: bool = False) -> None:
        for store in self.shards.values():
            store.create_tables(generations=generations)

    def drop_tables(self) -> None:
        for store in self.shards.values():
            store.drop_tables()

    def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
              progress: Callable[[str, int], None] | None = None, pace: float = DEFAULT_PACE) -> int:
        """Each shard's purge in turn; the rows deleted on all of them."""
        return sum(store.purge(older_than, batch_size, progress, pace) for store in self.shards.values())

    def stats(self) -> Stats:
        """Every shard's `stats` as one (`Stats.combined`), each shard's own in `.shards`."""
        return Stats.combined({shard: store.stats() for shard, store in self.shards.items()})

    # --- the protocol, on the scope's shard ----------------------------------------------------------------------

    def transaction(self, *, scope: str | None = None) -> AbstractContextManager[Any]:
        """A transaction on the shard of `scope`, for the step-by-step API."""
        return self._routed(scope, "transaction()").transaction()

    def claim(self, conn: Any, *, scope: str, operation: str, key: str, request: Any,
              lease: timedelta | None = None) -> Outcome:
        """On the shard of `scope`, whose connection `conn` must be; while the chooser moves the scope, a key its old
        shard recorded is answered from there."""
        store = self._owner(conn, scope)
        found = self.drive(self._looked_up(scope, operation, key, request, lease))
        if found is not None:
            return found
        return store.claim(conn, scope=scope, operation=operation, key=key, request=request, lease=lease)

    def complete(self, conn: Any, claimed: Claimed, response: Any, status: int = 200) -> None:
        self._owner(conn, claimed.scope).complete(conn, claimed, response, status)

    def release(self, conn: Any, claimed: Claimed) -> bool:
        return self._owner(conn, claimed.scope).release(conn, claimed)

    def accept_message(self, conn: Any, *, subscriber: str, message_id: str, payload: Any = NO_PAYLOAD) -> bool:
        """On the shard `conn` belongs to: the message is recorded where the handler's writes commit."""
        return self._owner(conn).accept_message(conn, subscriber=subscriber, message_id=message_id, payload=payload)

    def add_command(self, conn: Any, destination: str, payload: Any, headers: Mapping[str, str] | None = None, *,
                    scope: str | None = None, origin: Identity | Origin | None = None,
                    sequence: int | None = None) -> str:
        """On the shard `conn` belongs to: the command commits with the effect's writes, and that shard's outbox
        holds it until a relay (of this store, or of that shard) publishes it."""
        return self._owner(conn).add_command(conn, destination, payload, headers, scope=scope, origin=origin,
                                             sequence=sequence)

    def consume(self, *, subscriber: str, message_id: str, handler: Callable[[Any], Any], payload: Any = NO_PAYLOAD,
                on_mismatch: OnMismatch = Disposition.DEAD_LETTER, retry: RetryPolicy | None = None,
                scope: str | None = None) -> Delivery:
        """`consume` on the shard of `scope`: the owner of what the handler writes (a message names no scope)."""
        flow = self._consuming(scope, subscriber, message_id, payload, on_mismatch, retry)
        refuse_async_effect(handler, "handler")
        return self.drive(flow, effect=handler)

    def run(self, *, scope: str, operation: str, key: str, request: Any, effect: Callable[[Any], Any],
            status: int = 200, lease: timedelta | None = None, retry: RetryPolicy | None = None,
            on_in_flight: OnInFlight = "wait") -> Result:
        """`run` on the shard of `scope`: `effect` gets that shard's connection."""
        flow = self.claims.run(scope=scope, operation=operation, key=key, request=request, status=status,
                               lease=lease, retry=retry, on_in_flight=on_in_flight)  # validated before any SQL
        refuse_async_effect(effect)
        return self.drive(flow, effect=effect)

    # --- changing the placement -----------------------------------------------------------------------------------

    def move_records(self, *, batch_size: int = 500, wait: timedelta = timedelta(minutes=5),
                     poll: float = 1.0) -> MoveReport:
        """While the chooser is a `Move`: copy every moving scope's completed records from its old shard to its new
        one, mark its abandoned claims moved, and wait (up to `wait`, looking every `poll` seconds) for its live
        claims there to end; then copy the processed messages of each shard that loses scopes to the shards that
        gain them. Run it once every process routes with the `Move`; once `done`, the store may route by `after`
        alone. Safe to run again (what is there already is kept). See docs: Scaling out."""
        return self.drive(move_records(self.claims, batch_size, wait, poll))

    # --- the loop adapters drive `claims` and `outbox` with -------------------------------------------------------

    def drive(self, flow: Flow[T], conn: Any = None, effect: Callable[[Any], Any] | None = None) -> T:
        stepper = Stepper(flow)
        while (step := stepper.next()) is not None:
            try:
                stepper.send(self._step(step, conn, effect))
            except BaseException as exc:
                stepper.throw(exc)
        return stepper.value

    def _step(self, step: Step | OnShard, conn: Any, effect: Callable[[Any], Any] | None) -> Any:
        if isinstance(step, OnShard):
            store = self.shards[step.shard]
            if step.alone:
                return store.drive(step.body, None, effect)
            if isinstance(conn, _Pending):
                held, flow = conn.on(step.shard, store, step.body)
                return store.drive(flow, held, effect)
            if conn is not None:  # a caller's connection (step-by-step): it must be of this shard
                found = owner(self.shards, conn)
                if found != step.shard:
                    raise crossing(found, step.shard)
            return store.drive(step.body, conn, effect)
        if isinstance(step, Transaction):
            with ExitStack() as stack:
                return self.drive(step.body, _Pending(step.begin, stack), effect)
        if isinstance(step, Effect):
            assert effect is not None, "a flow with an Effect step needs an effect"
            with beating(step.heartbeat, self.drive):
                response = effect(conn.connection if isinstance(conn, _Pending) else conn)
            refuse_awaitable(response)
            return response
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        raise CrossShard(f"{type(step).__name__} outside any shard: route it with the store's `claims`")

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the shards' stores if `from_urls` made them."""
        if self._owned:
            for store in self.shards.values():
                store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShardedStore(shards={list(self.shards)!r})"


if TYPE_CHECKING:  # mypy holds each class against its declared surface (api.py)
    def _surface(it: ShardedStore) -> StoreAPI[Any]:
        return it
