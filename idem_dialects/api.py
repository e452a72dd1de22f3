"""The store surface, declared once: what every store type offers (`StoreAPI`, `AsyncStoreAPI`) and what a store is
built on (`Executor`, `AsyncExecutor`), as `typing.Protocol`s that mypy checks each store type against.

Every feature is written against these, never against one store class: the HTTP runners, the consumers, the relays
and the CLI take any store of the surface, so a feature works through every store type that can carry it — the plain
stores, the sharded ones, Django's, and the conformance suite's. docs: "Store types" has the table of features by store
type, each cell a test.

The executor is the one public extension point below a store (as httpx's `BaseTransport` is below its client): how a
transaction begins on the store's own connection, how one of its statements runs, how schema work runs, and whether
a caller's connection may be used. The protocol itself (claim, compare, complete) is the flows' (`claims.py`), never
an executor's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

from .errors import RetryCause
from .features import Features
from .fingerprint import Encoder
from .limits import DEFAULT_PACE, OnInFlight
from .outcomes import Claimed, Delivery, OnMismatch, Outcome, Result
from .retry import RetryPolicy
from .steps import Begin, Flow, Heartbeat, Statement

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from .core import Request
    from .ids import Identity, Origin
    from .outbox import Command, Failure, OutboxStats
    from .retention import Stats
    from .telemetry import Telemetry

T = TypeVar("T")
C = TypeVar("C")  # the connection a store's transactions (and so its effects) get
Cin = TypeVar("Cin", contravariant=True)


# --- what a store is built on ----------------------------------------------------------------------------------------


class Executor(Protocol[C]):
    """How a sync store reaches its database. `IdempotencyStore` is built on an `EngineExecutor` (SQLAlchemy's engine
    and pool); `DjangoStore` on Django's connection. The store runs the backend's BEGIN statements and the protocol's
    statements through it, in the transactions it opens."""

    def transaction(self, begin: Begin) -> AbstractContextManager[C]:
        """A connection of the executor's own, in a transaction begun as `begin` says: committed when the block
        ends, rolled back when it raises."""
        ...

    def execute(self, conn: C, statement: Statement, params: Mapping[str, Any]) -> Any:
        """Run one of the store's statements on `conn`: what its `shape` asks for."""
        ...

    def catalog(self, conn: C, action: Callable[[Connection], T]) -> T:
        """Run work on the catalog (CREATE, DROP, a table's existence, a row estimate) on SQLAlchemy's Connection of
        `conn`."""
        ...

    def check(self, conn: C) -> None:
        """A caller's connection for the step-by-step API: refused (raised) if the store may not run on it."""
        ...

    def close(self) -> None:
        """Let go of what the executor opened itself (an engine a store made from a URL); a caller's is theirs."""
        ...


class AsyncExecutor(Protocol[C]):
    """`Executor` for the async store: the same operations, awaited where they reach the database."""

    def transaction(self, begin: Begin) -> AbstractAsyncContextManager[C]: ...

    def execute(self, conn: C, statement: Statement, params: Mapping[str, Any]) -> Awaitable[Any]: ...

    async def catalog(self, conn: C, action: Callable[[Connection], T]) -> T: ...

    def check(self, conn: C) -> None: ...

    async def close(self) -> None: ...


# --- the flows a store drives -----------------------------------------------------------------------------------------


class ClaimFlows(Protocol):
    """The protocol's claim flows (`claims.Claims`, or a sharded store's, routed by scope): what adapters such as the
    HTTP layer build their own flows on and run with the store's `drive`."""

    @property
    def features(self) -> Features: ...

    def retrying(self, attempt: Callable[[], Flow[T]], policy: RetryPolicy | None = None) -> Flow[T]: ...

    def retry_cause(self, exc: BaseException) -> RetryCause | None: ...

    def span(self, name: str, operation: str, flow: Flow[T], describe: Callable[[T], dict[str, Any]]) -> Flow[T]: ...

    def request(self, scope: object, operation: object, key: object, request: object,
                lease: timedelta | None = None) -> Request: ...

    def claim(self, req: Request, *, wait: bool = True, fresh: bool = False) -> Flow[Outcome]: ...

    def complete(self, claimed: Claimed, response: Any, status: int = 200) -> Flow[None]: ...

    def release(self, claimed: Claimed) -> Flow[bool]: ...

    def renew(self, claimed: Claimed, lease: float) -> Flow[bool]: ...

    def heartbeat(self, claimed: Claimed, lease: float, *, in_transaction: bool = False) -> Heartbeat | None: ...

    def release_after(self, claimed: Claimed, error: BaseException) -> Flow[None]: ...

    def run(self, *, scope: str, operation: str, key: str, request: Any, status: int = 200,
            lease: timedelta | None = None, retry: RetryPolicy | None = None,
            on_effect: Callable[[Any], Any] | None = None, on_in_flight: OnInFlight = "wait") -> Flow[Result]: ...


class OutboxFlows(Protocol):
    """The outbox's flows for relays and operators (`outbox.Outbox`, or a sharded store's over every shard)."""

    @property
    def telemetry(self) -> Telemetry: ...

    @property
    def table(self) -> str:
        """The outbox table's name (one name on every shard)."""
        ...

    def claim(self, token: str, limit: int, lease: float, ordered: bool = True) -> Flow[list[Command]]: ...

    def settle(self, token: str, published: Sequence[str], failed: Sequence[Failure] = (),
               released: Sequence[str] = ()) -> Flow[int]: ...

    def stats(self) -> Flow[OutboxStats]: ...

    def requeue(self) -> Flow[int]: ...


# --- the store surface ------------------------------------------------------------------------------------------------


class StoreAPI(Protocol[C]):
    """What every sync store offers: `IdempotencyStore`, `ShardedStore`, `DjangoStore` (and the conformance suite's
    store). `C` is the connection its transactions and effects get. A store on several databases routes each call by
    `scope` (`transaction` and `consume` take it for that; a store on one database checks it and needs none)."""

    @property
    def table_prefix(self) -> str: ...

    @property
    def features(self) -> Features: ...

    @property
    def claims(self) -> ClaimFlows: ...

    @property
    def outbox(self) -> OutboxFlows: ...

    @property
    def retries(self) -> Counter[str]: ...

    @property
    def retry(self) -> RetryPolicy: ...

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None: ...

    @property
    def retention(self) -> timedelta: ...

    @retention.setter
    def retention(self, window: timedelta) -> None: ...

    @property
    def encoder(self) -> Encoder | None: ...

    @encoder.setter
    def encoder(self, encoder: Encoder | None) -> None: ...

    def retry_cause(self, exc: BaseException) -> RetryCause | None: ...

    def create_tables(self, *, generations: bool = False) -> None: ...

    def drop_tables(self) -> None: ...

    def transaction(self, *, scope: str | None = None) -> AbstractContextManager[C]: ...

    def claim(self, conn: C, *, scope: str, operation: str, key: str, request: Any,
              lease: timedelta | None = None) -> Outcome: ...

    def complete(self, conn: C, claimed: Claimed, response: Any, status: int = 200) -> None: ...

    def release(self, conn: C, claimed: Claimed) -> bool: ...

    def accept_message(self, conn: C, *, subscriber: str, message_id: str, payload: Any = ...) -> bool: ...

    def add_command(self, conn: C, destination: str, payload: Any, headers: Mapping[str, str] | None = None, *,
                    scope: str | None = None, origin: Identity | Origin | None = None,
                    sequence: int | None = None) -> str: ...

    def consume(self, *, subscriber: str, message_id: str, handler: Callable[[C], Any], payload: Any = ...,
                on_mismatch: OnMismatch = ..., retry: RetryPolicy | None = None,
                scope: str | None = None) -> Delivery: ...

    def run(self, *, scope: str, operation: str, key: str, request: Any, effect: Callable[[C], Any],
            status: int = 200, lease: timedelta | None = None, retry: RetryPolicy | None = None,
            on_in_flight: OnInFlight = "wait") -> Result: ...

    def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
              progress: Callable[[str, int], None] | None = None, pace: float = DEFAULT_PACE) -> int: ...

    def stats(self) -> Stats: ...

    def drive(self, flow: Flow[T], conn: C | None = None, effect: Callable[[C], Any] | None = None) -> T: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


class AsyncStoreAPI(Protocol[C]):
    """`StoreAPI` for asyncio: `AsyncIdempotencyStore`, `AsyncShardedStore`. The same names and parameters; every
    call that reaches the database is awaited, and effects and handlers are `async def`."""

    @property
    def table_prefix(self) -> str: ...

    @property
    def features(self) -> Features: ...

    @property
    def claims(self) -> ClaimFlows: ...

    @property
    def outbox(self) -> OutboxFlows: ...

    @property
    def retries(self) -> Counter[str]: ...

    @property
    def retry(self) -> RetryPolicy: ...

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None: ...

    @property
    def retention(self) -> timedelta: ...

    @retention.setter
    def retention(self, window: timedelta) -> None: ...

    @property
    def encoder(self) -> Encoder | None: ...

    @encoder.setter
    def encoder(self, encoder: Encoder | None) -> None: ...

    def retry_cause(self, exc: BaseException) -> RetryCause | None: ...

    async def create_tables(self, *, generations: bool = False) -> None: ...

    async def drop_tables(self) -> None: ...

    def transaction(self, *, scope: str | None = None) -> AbstractAsyncContextManager[C]: ...

    async def claim(self, conn: C, *, scope: str, operation: str, key: str, request: Any,
                    lease: timedelta | None = None) -> Outcome: ...

    async def complete(self, conn: C, claimed: Claimed, response: Any, status: int = 200) -> None: ...

    async def release(self, conn: C, claimed: Claimed) -> bool: ...

    async def accept_message(self, conn: C, *, subscriber: str, message_id: str, payload: Any = ...) -> bool: ...

    async def add_command(self, conn: C, destination: str, payload: Any, headers: Mapping[str, str] | None = None,
                          *, scope: str | None = None, origin: Identity | Origin | None = None,
                          sequence: int | None = None) -> str: ...

    async def consume(self, *, subscriber: str, message_id: str, handler: Callable[[C], Awaitable[Any]],
                      payload: Any = ..., on_mismatch: OnMismatch = ..., retry: RetryPolicy | None = None,
                      scope: str | None = None) -> Delivery: ...

    async def run(self, *, scope: str, operation: str, key: str, request: Any,
                  effect: Callable[[C], Awaitable[Any]], status: int = 200, lease: timedelta | None = None,
                  retry: RetryPolicy | None = None, on_in_flight: OnInFlight = "wait") -> Result: ...

    async def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
                    progress: Callable[[str, int], None] | None = None, pace: float = DEFAULT_PACE) -> int: ...

    async def stats(self) -> Stats: ...

    async def drive(self, flow: Flow[T], conn: C | None = None,
                    effect: Callable[[C], Awaitable[Any]] | None = None) -> T: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None: ...

