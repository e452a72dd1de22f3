"""The steps a protocol flow yields: descriptions of I/O, the only things the stores execute differently.

A *flow* is a generator that yields steps and is sent each step's result (or has its error thrown in), the way
httpx drives its auth flows. A statement is data: `Exec` names one of the store's statements and its parameters, and
says what result it wants (`Shape`); the loop hands it to an executor for its driver (the DBAPI cursor for a sync
driver, an async driver's own API, or SQLAlchemy's `Connection.execute` where asked). Every decision (what to claim,
when to retry, what to release) is in the flows; a loop only executes.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar, final

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.sql.base import Executable

T = TypeVar("T")


class Begin(Enum):
    """How a transaction begins: the backend's way for the store's statements, or for a claim as `run`'s first
    statement (which a backend may begin more cheaply, e.g. without the write lock a replay does not need)."""

    STORE = "store"
    CLAIM = "claim"
    PURGE = "purge"  # a purge batch: at the weakest isolation that keeps claims beside it unblocked (READ COMMITTED)


class Shape(Enum):
    """What a flow wants back from a statement."""

    ROWCOUNT = "rowcount"  # how many rows it touched
    ROW = "row"  # its first row (attributes by column name), or None
    ROWS = "rows"  # every row it returns (a small batch: purge's keys)
    NOTHING = "nothing"  # session settings, transaction control


@dataclass(frozen=True, eq=False)
class Statement:
    """One of the store's statements, built once (SQLAlchemy Core) and executed many times with parameters. An
    executor compiles it once per dialect and driver and keeps that in `compiled`. `tables` are the store's tables
    it names: an error that says one of them is missing, or not granted, is told as such (`guard`)."""

    clause: Executable
    shape: Shape
    tables: tuple[str, ...] = ()
    compiled: dict[Any, Any] = field(default_factory=dict, repr=False)  # dialect -> its plan


@final  # every step class: the loops tell steps apart by `type(step) is`, which is no call
@dataclass(frozen=True, slots=True)
class Exec:
    """Execute `statement` with `params` (bind parameter name -> Python value) in the flow's transaction."""

    statement: Statement
    params: Mapping[str, Any]


@final
@dataclass(frozen=True, slots=True)
class Catalog(Generic[T]):
    """Run `action` on SQLAlchemy's `Connection` of the flow's transaction: work on the database's catalog that
    SQLAlchemy does, off every request's path - CREATE and DROP (its DDL compilers), a table's existence (its
    inspector), a planner's row estimate. The async store runs it through `run_sync`."""

    action: Callable[[Connection], T]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Keep a leased claim alive while the effect runs: every `interval` seconds the loop runs `beat()` (a flow that
    renews the lease in a transaction of its own, on a connection of its own) until the effect ends or a beat returns
    False (the claim is no longer ours). Only the timer differs per loop (`heartbeat.py`)."""

    interval: float
    beat: Callable[[], Flow[bool]]


@final
@dataclass(frozen=True, slots=True)
class Effect:
    """Call the caller's effect with the flow's connection (None outside a transaction); its value is sent back.
    With `heartbeat`, the loop renews the claim's lease while the effect runs."""

    heartbeat: Heartbeat | None = None


@final
@dataclass(frozen=True, slots=True)
class Transaction:
    """Run `body` on a new connection, in a transaction begun as `begin` says: committed if the body returns,
    rolled back if it raises. `shielded`: carried through even if the caller is cancelled meanwhile (a release)."""

    body: Flow[Any]
    begin: Begin = Begin.STORE
    shielded: bool = False


@final
@dataclass(frozen=True, slots=True)
class Statements:
    """Run `body`, a flow that yields only `Exec` steps (a claim, a completion), to its end as one step: what the
    protocol does between two of the loop's other steps. A loop may send it whole to where the connection lives (the
    async SQLite store: one hop to aiosqlite's thread instead of one per statement), so its code between statements
    must not leave a context variable set for the caller's code after it (it may run in a copy of the context).
    Claims come as this step only to a loop that asks (`Core.statement_steps`)."""

    body: Flow[Any]


@final
@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait between retries (`time.sleep` or `asyncio.sleep`)."""

    seconds: float


Step: TypeAlias = "Exec | Statements | Catalog[Any] | Effect | Transaction | Sleep"
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
        finally:
            # An error the flow does not catch leaves with this frame in its traceback: holding it here would be a
            # reference cycle per failed request, freed only by a garbage collection.
            del sent, error

    def send(self, result: Any) -> None:
        self._sent = result

    def throw(self, error: BaseException) -> None:
        self._error = error


def execute(statement: Statement, params: Mapping[str, Any] | None = None) -> Flow[Any]:
    """A flow of one statement: what its `shape` asks for."""
    return (yield Exec(statement, params or {}))


def rowcount(statement: Statement, params: Mapping[str, Any] | None = None) -> Flow[int]:
    """A flow of one statement whose shape is ROWCOUNT: how many rows it touched."""
    return (yield Exec(statement, params or {}))  # type: ignore[no-any-return]


def statements(body: Flow[T]) -> Flow[T]:
    """`body` (statements only) as one `Statements` step."""
    return (yield Statements(body))  # type: ignore[no-any-return]


def catalog(action: Callable[[Connection], T]) -> Flow[T]:
    """A flow of one action on the catalog, on SQLAlchemy's Connection."""
    return (yield Catalog(action))  # type: ignore[no-any-return]


def transaction(body: Flow[T], begin: Begin = Begin.STORE, *, shielded: bool = False) -> Flow[T]:
    """A flow that runs `body` in a transaction of its own."""
    return (yield Transaction(body, begin, shielded))  # type: ignore[no-any-return]
