"""The steps a protocol flow yields: the only things the sync and async stores do differently.

A *flow* is a generator that yields steps and is sent each step's result (or has its error thrown in), the way
httpx drives its auth flows. `IdempotencyStore` executes steps with plain calls and `AsyncIdempotencyStore` awaits
them; every decision (what to claim, when to retry, what to release) is in the flows of `protocol.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeAlias, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.sql.base import Executable

T = TypeVar("T")


class Begin(Enum):
    """How a transaction begins: the backend's way for the store's statements, or for a claim as `run`'s first
    statement (which a backend may begin more cheaply, e.g. without the write lock a replay does not need)."""

    STORE = "store"
    CLAIM = "claim"


@dataclass(frozen=True, slots=True)
class Sql(Generic[T]):
    """Run `fn` on the flow's connection: a sync `Connection` (the async store runs it through `run_sync`)."""

    fn: Callable[[Connection], T]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Keep a leased claim alive while the effect runs: every `interval` seconds the loop runs `beat()` (a flow that
    renews the lease in a transaction of its own, on a connection of its own) until the effect ends or a beat returns
    False (the claim is no longer ours). Only the timer differs per loop (`heartbeat.py`)."""

    interval: float
    beat: Callable[[], Flow[bool]]


@dataclass(frozen=True, slots=True)
class Effect:
    """Call the caller's effect with the flow's connection (None outside a transaction); its value is sent back.
    With `heartbeat`, the loop renews the claim's lease while the effect runs."""

    heartbeat: Heartbeat | None = None


@dataclass(frozen=True, slots=True)
class Transaction:
    """Run `body` on a new connection, in a transaction begun as `begin` says: committed if the body returns,
    rolled back if it raises. `shielded`: carried through even if the caller is cancelled meanwhile (a release)."""

    body: Flow[Any]
    begin: Begin = Begin.STORE
    shielded: bool = False


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait between retries (`time.sleep` or `asyncio.sleep`)."""

    seconds: float


Step: TypeAlias = "Sql[Any] | Effect | Transaction | Sleep"
Flow: TypeAlias = Generator[Step, Any, T]


def execute_unlogged(conn: Connection, fn: Callable[[Connection], T]) -> T:
    """Execute a statement step, `fn(conn)`, out of SQLAlchemy's engine log (both stores' loops run `Sql` steps
    through this). With echo=True/"debug", or the ``sqlalchemy.engine`` logger at INFO/DEBUG, a connection logs each
    statement and its result rows - a replay's row holds the stored response and the claim token, which
    hide_parameters does not cover. The flag is per connection, so the caller's effect on the same connection is
    logged as before; tests/test_log_secrets.py fails if SQLAlchemy renames it."""
    echo = getattr(conn, "_echo", False)
    if not echo:
        return fn(conn)
    conn._echo = False
    try:
        return fn(conn)
    finally:
        conn._echo = echo


class Stepper(Generic[T]):
    """A flow as a loop drives it: `next()` is the step to execute (None once the flow has returned `value`);
    `send` gives it the step's result, `throw` the step's error."""

    def __init__(self, flow: Flow[T]) -> None:
        self._flow = flow
        self._sent: Any = None
        self._error: BaseException | None = None
        self.value: T

    def next(self) -> Step | None:
        sent, error = self._sent, self._error
        self._sent = self._error = None
        try:
            return self._flow.send(sent) if error is None else self._flow.throw(error)
        except StopIteration as done:
            self.value = done.value
            return None

    def send(self, result: Any) -> None:
        self._sent = result

    def throw(self, error: BaseException) -> None:
        self._error = error


def sql(fn: Callable[[Connection], T]) -> Flow[T]:
    """A flow of one statement step."""
    return (yield Sql(fn))  # type: ignore[no-any-return]


def rowcount(statement: Executable, params: dict[str, Any]) -> Flow[int]:
    """A flow that executes one DML statement and returns how many rows it touched."""
    return (yield Sql(lambda conn: conn.execute(statement, params).rowcount))  # type: ignore[no-any-return]


def transaction(body: Flow[T], begin: Begin = Begin.STORE, *, shielded: bool = False) -> Flow[T]:
    """A flow that runs `body` in a transaction of its own."""
    return (yield Transaction(body, begin, shielded))  # type: ignore[no-any-return]
