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
class Effect:
    """Call the caller's effect with the flow's connection (None outside a transaction); its value is sent back."""


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
