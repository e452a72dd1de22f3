"""What a claim can come back with, and what `run` returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from .errors import RequestMismatch


@dataclass(frozen=True, slots=True)
class Claimed:
    """This attempt holds the key: run the effect, then `complete` with `token` in the same transaction."""

    scope: str
    operation: str
    key: str
    fingerprint: str
    """The request's RFC 8785 fingerprint, stored with the claim: a later use of the key is compared with it."""
    token: str
    """This claim's fencing token: `complete` and `release` act only while the record still holds it."""
    leased: bool
    """Claimed with a lease (committed alone, the effect in a later transaction) rather than atomically."""
    taken_over: bool = False
    """The key was claimed before by an attempt whose lease ended without completing; this one took it over."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """The key was completed before with the same request: return the stored result, do not run the effect."""

    response: Any
    status: int
    completed_at: datetime
    """When the first attempt committed, by the database's clock."""
    own: bool = False
    """Completed by this very `run` (its COMMIT went through, the reply was lost, the retry found its own claim
    token): the caller gets its own first result, not a replay."""


@dataclass(frozen=True, slots=True)
class InFlight:
    """Another attempt holds a live lease on the key; ask the client to retry after `retry_after` seconds."""

    retry_after: float
    locked_until: datetime


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The key was first used with a different request (HTTP 422); the effect must not run."""

    stored_fingerprint: str
    given_fingerprint: str


Outcome = Claimed | Replayed | InFlight | Mismatch


@dataclass(frozen=True, slots=True)
class Result:
    """What `run` returns: the effect's response and status, first time or replayed byte-exact."""

    response: Any
    status: int
    replayed: bool


class Disposition(StrEnum):
    """What a consumer does with a message once `consume` is done with it."""

    ACK = "ack"
    """Processed now, or before (a redelivery, the handler not run again): acknowledge it."""
    RETRY = "retry"
    """Not processed: leave it to the broker to deliver again later (nak with a delay, requeue, leave pending)."""
    DEAD_LETTER = "dead-letter"
    """Not processed and never will be as it is: to the dead-letter queue, for a person to look at."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """What `consume` did with one delivery of a message."""

    disposition: Disposition
    duplicate: bool = False
    """The message was processed before (this is a redelivery or a duplicate publish): the handler did not run."""
    value: Any = None
    """What the handler returned, when it ran."""
    mismatch: RequestMismatch | None = None
    """The message id was first processed with a different payload: the handler did not run, and `disposition`
    is what the caller's `on_mismatch` chose."""


OnMismatch: TypeAlias = "Disposition | Callable[[RequestMismatch], Disposition]"
"""What a consumer does with a message whose id was first processed with a different payload."""
