"""Stable ids for what an effect asks of other systems: the outbox's command ids and the idempotency keys of provider
calls, derived from the record's identity so a retried request (a retry of `run`, a takeover of a leased claim, a
redelivered message) sends the same id as its first attempt.

The derivation is documented and portable: the first 128 bits of SHA-256 over the RFC 8785 canonical JSON of
``["idem-dialects/v1", kind, scope, operation, key, part]``, written as an RFC 9562 version 8 UUID (the version for
ids derived by a method of one's own). Another service can compute the same id from the same identity.

While an effect runs (`run`'s, an HTTP handler's in atomic mode, a consumer's handler), the record it runs for is
`current()`: the outbox numbers its commands from it, and `downstream_key` derives keys from it without being told.
"""

from __future__ import annotations

import hashlib
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

import rfc8785

from .errors import IdemError
from .keys import check_identifier

_VERSION = "idem-dialects/v1"
RECORD, MESSAGE = "record", "message"
MESSAGE_OPERATION = "message"  # the operation column of a command a consumer's handler wrote


class Identity(Protocol):
    """What has a record's identity: a `Claimed` outcome, an `Origin`."""

    @property
    def scope(self) -> str: ...

    @property
    def operation(self) -> str: ...

    @property
    def key(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Origin:
    """The record (or processed message) whose effect writes commands: `kind` keeps a message's ids apart from any
    record's. For a message, `scope` is the subscriber and `key` the message id."""

    scope: str
    operation: str
    key: str
    kind: str = RECORD


@dataclass(slots=True)
class Writing:
    """The effect running now: its origin, and the sequence number its next command gets (0, 1, ... in the order
    the effect writes them; a retried effect numbers them again from 0, so its ids are the first attempt's)."""

    origin: Origin
    sequence: int = field(default=0)

    def next(self) -> int:
        number, self.sequence = self.sequence, self.sequence + 1
        return number


_current: ContextVar[Writing | None] = ContextVar("idem_dialects_effect", default=None)


def current() -> Writing | None:
    """The effect running in this thread or task, or None outside one."""
    return _current.get()


def entering(origin: Origin) -> object:
    """Make `origin`'s effect current (a token for `leaving`): the flows call this around the effect."""
    return _current.set(Writing(origin))


def leaving(token: object) -> None:
    try:
        _current.reset(token)  # type: ignore[arg-type]
    except ValueError:  # a flow closed from another context (collected): that context's value is not ours to fix
        pass


def derive(kind: str, scope: str, operation: str, key: str, part: int | str) -> str:
    """The id for `part` (a command's sequence number, a provider call's purpose) of one identity."""
    canonical = rfc8785.dumps([_VERSION, kind, scope, operation, key, part])
    raw = bytearray(hashlib.sha256(canonical).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x80  # version 8
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 9562 variant
    return str(uuid.UUID(bytes=bytes(raw)))


def command_id(scope: str, operation: str, key: str, sequence: int) -> str:
    """The id of the `sequence`-th command (from 0) written by the effect of record (scope, operation, key): the
    message id / deduplication header / Idempotency-Key its relay publishes it with."""
    return derive(RECORD, scope, operation, key, sequence)


def origin_of(record: Identity | Origin) -> Origin:
    if isinstance(record, Origin):
        return record
    return Origin(record.scope, record.operation, record.key)


def downstream_key(purpose: str = "call", *, record: Identity | Origin | None = None) -> str:
    """The idempotency key to send a provider (a payment API, another service) for `purpose` of a record: the same
    for every attempt of the request, different for each purpose. `record` defaults to the effect running now.

    A retried request, a leased claim taken over after a crash, or a retried effect sends the provider the key of the
    first attempt, so the provider's own deduplication makes its side happen once."""
    check_identifier("purpose", purpose)
    if record is None:
        writing = current()
        if writing is None:
            raise IdemError("downstream_key() without `record` works only inside an effect (run's effect, an HTTP"
                            " handler in atomic mode, a consumer's handler); pass record=claimed elsewhere")
        found = writing.origin
    else:
        found = origin_of(record)
    return derive(f"{found.kind}-downstream", found.scope, found.operation, found.key, purpose)
