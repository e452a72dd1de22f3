"""The transactional outbox: commands for other systems written in the effect's transaction, and the flows a relay
runs to publish them. Written once as flows; the stores' loops (sync and async) and the relays drive them.

A command commits with the record and the business write or not at all: a rolled-back effect leaves none, a replay
runs no effect and adds none, and a retried effect writes the same ids (`commands.command_id`), which the insert
absorbs. A relay claims due commands with the backend's `lock_batch` (each engine's skip-locked read) and leases
them (`claim_token`, `available_at` pushed on by the lease) in one short transaction, publishes them outside any
transaction, then marks them, fenced by its lease: a relay killed between publishing and marking loses nothing (the
lease ends and another relay publishes them again, under the same id, which the receiving inbox deduplicates).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, bindparam, case, exists, func, literal_column, null, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from .core import Core
from .dialects.base import statement
from .errors import InvalidPayload
from .fingerprint import decode_response, encode_response
from .ids import Origin, derive
from .keys import check_identifier
from .schema import DEAD, ERROR_LENGTH, PENDING, PUBLISHED
from .steps import Flow, Shape, Statement, execute, rowcount, transaction
from .telemetry import Telemetry

MAX_BATCH = 500  # commands per claim: the IN list of its ids stays far below Oracle's 1000


@dataclass(frozen=True, slots=True)
class Command:
    """One command as a relay hands it to a publisher. `id` is stable: publish it as the message id, the
    deduplication header, or the `Idempotency-Key` of an HTTP call. `attempts`: failed publishes so far."""

    id: str
    destination: str
    payload: bytes
    content_type: str
    headers: Mapping[str, str]
    scope: str
    operation: str
    key: str
    sequence: int
    attempts: int
    created_at: datetime

    def json(self) -> Any:
        """The payload as the effect gave it, where that was a JSON value."""
        return json.loads(self.payload)


@dataclass(frozen=True, slots=True)
class Failure:
    """A command whose publish failed: retried after `delay` seconds, or dead-lettered (`dead`)."""

    id: str
    error: str
    dead: bool
    delay: int = 0


@dataclass(frozen=True)
class OutboxStats:
    """The outbox now (the database's clock): commands waiting, published (kept until retention), dead-lettered."""

    db_now: datetime
    pending: int
    published: int
    dead: int
    oldest_pending: datetime | None

    @property
    def oldest_pending_age(self) -> float:
        """Seconds the oldest pending command has waited (0 with none)."""
        return 0.0 if self.oldest_pending is None else max(0.0, (self.db_now - self.oldest_pending).total_seconds())

    def as_dict(self) -> dict[str, Any]:
        return {"pending": self.pending, "published": self.published, "dead": self.dead,
                "oldest_pending_age_seconds": self.oldest_pending_age}

    @classmethod
    def combined(cls, parts: Sequence[OutboxStats]) -> OutboxStats:
        """Several outboxes (a sharded store's) as one: counts summed, the oldest pending command of any of them (its
        age on its own database's clock)."""
        oldest = max(parts, key=lambda p: p.oldest_pending_age)
        return cls(oldest.db_now, sum(p.pending for p in parts), sum(p.published for p in parts),
                   sum(p.dead for p in parts), oldest.oldest_pending)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def check_headers(headers: object) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in headers.items()):
        raise InvalidPayload("headers", "must be a mapping of str to str")
    for name in headers:
        if not name or not name.isascii() or not name.isprintable() or ":" in name:
            raise InvalidPayload("headers", f"header name {name!r} must be printable ASCII without ':'")
    return dict(headers)


@dataclass
class Prepared:
    """A command validated before any SQL: its id and its row."""

    id: str
    values: dict[str, Any] = field(repr=False)


class Outbox:
    """The outbox flows on one store's `Core`."""

    def __init__(self, core: Core) -> None:
        self.core = core
        t = core.tables.outbox
        earlier = t.alias("earlier")
        before = or_(earlier.c.created_at < t.c.created_at, and_(earlier.c.created_at == t.c.created_at, or_(
            earlier.c.seq < t.c.seq, and_(earlier.c.seq == t.c.seq, earlier.c.command_id < t.c.command_id))))
        self._due = and_(t.c.state == PENDING, t.c.available_at <= core.backend.now())
        # The head of its scope's queue: no earlier command of the scope still waits (leased, backing off, or due).
        self._head = and_(self._due, ~exists(select(literal_column("1")).select_from(earlier).where(
            earlier.c.scope == t.c.scope, earlier.c.state == PENDING, before)))
        # Due first, in the (state, available_at) index's own order: a claim reads (and, on InnoDB, locks) about the
        # rows it takes and stops, instead of every due row a sort would need (measured on a fresh PostgreSQL table:
        # 4 s a round with a tie-breaking column, 0.4 s without). A scope's order is the head rule's, not this.
        self._order = (t.c.available_at,)
        self._columns = [c for c in t.c if c.name not in ("state", "available_at", "claim_token", "last_error")]

    @property
    def telemetry(self) -> Telemetry:
        """The store's telemetry, where relays report what they published."""
        return self.core.telemetry

    @property
    def table(self) -> str:
        """The outbox table's name."""
        return self.core.tables.outbox.name

    # --- writing, in the effect's transaction ------------------------------------------------------------------

    def prepare(self, origin: Origin, sequence: int, destination: object, payload: object,
                headers: object = None, scope: object = None) -> Prepared:
        """Validate a command before any SQL (InvalidKey, InvalidPayload) and derive its id."""
        if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 0:
            raise InvalidPayload("sequence", f"must be an int >= 0, got {sequence!r}")
        kind = origin.kind
        command = derive(kind, origin.scope, origin.operation, origin.key, sequence)
        ordering = origin.scope if scope is None else check_identifier("scope", scope)
        body = encode_response(payload, self.core.encoder)
        values = {"command_id": command, "scope": ordering, "operation": origin.operation,
                  "idem_key": origin.key,
                  "seq": sequence, "destination": check_identifier("destination", destination), "payload": body,
                  "headers": encode_response(check_headers(headers)), "state": PENDING, "attempts": 0}
        return Prepared(command, values)

    def add(self, command: Prepared) -> Flow[bool]:
        """Insert the command in the caller's transaction; False if a command with its id was written before (a
        retried effect's): the first one stands."""
        t = self.core.tables.outbox
        return (yield from self.core.backend.insert_if_absent(t, command.values,
                                                               {"created_at": 0.0, "available_at": 0.0}))

    # --- the relay's flows: each in a transaction of its own, retried like `run` -------------------------------

    def claim(self, token: str, limit: int, lease: float, ordered: bool = True) -> Flow[list[Command]]:
        """Lease up to `limit` due commands to the relay `token` for `lease` seconds, oldest first. `ordered`: only
        the oldest waiting command of each scope (a scope's commands go out one after another, in order)."""
        limit = max(1, min(int(limit), MAX_BATCH))
        return self.core.retrying(lambda: transaction(self._claim(token, limit, float(lease), ordered)))

    def _claim(self, token: str, limit: int, lease: float, ordered: bool) -> Flow[list[Command]]:
        t, backend = self.core.tables.outbox, self.core.backend
        rows = yield from backend.lock_batch(t, self._columns, self._head if ordered else self._due, self._order,
                                             limit)
        if not rows:
            return []
        stmt = self._by_ids("lease", limit, lambda ids: update(t).where(ids, t.c.state == PENDING).values(
            claim_token=bindparam("token", type_=t.c.claim_token.type), available_at=backend.now_plus(lease)),
            lease)
        yield from rowcount(stmt, self._ids([r.command_id for r in rows], limit) | {"token": token})
        found = [_command(r) for r in rows]
        found.sort(key=lambda c: (c.created_at, c.sequence, c.id))
        return found

    def settle(self, token: str, published: Sequence[str], failed: Sequence[Failure] = (),
               released: Sequence[str] = ()) -> Flow[int]:
        """Mark what the relay `token` published, failed to publish, or gave back unattempted, fenced by its lease
        (a command another relay has leased since is left to that one). Returns how many were marked published."""
        return self.core.retrying(lambda: transaction(self._settle(token, published, failed, released)))

    def _settle(self, token: str, published: Sequence[str], failed: Sequence[Failure],
                released: Sequence[str]) -> Flow[int]:
        t, backend = self.core.tables.outbox, self.core.backend
        fenced = (t.c.claim_token == bindparam("token", type_=t.c.claim_token.type), t.c.state == PENDING)
        done = 0
        for start in range(0, len(published), MAX_BATCH):
            chunk = published[start:start + MAX_BATCH]
            stmt = self._by_ids("published", MAX_BATCH, lambda ids: update(t).where(ids, *fenced).values(
                state=PUBLISHED, available_at=backend.now(), claim_token=null()))
            done += yield from rowcount(stmt, self._ids(chunk, MAX_BATCH) | {"token": token})
        for start in range(0, len(released), MAX_BATCH):
            chunk = released[start:start + MAX_BATCH]
            stmt = self._by_ids("released", MAX_BATCH, lambda ids: update(t).where(ids, *fenced).values(
                available_at=backend.now(), claim_token=null()))
            yield from rowcount(stmt, self._ids(chunk, MAX_BATCH) | {"token": token})
        for failure in failed:
            yield from rowcount(self._failed(failure.dead, failure.delay),
                                {"id": failure.id, "token": token, "error": _error_text(failure.error)})
        return done

    def _failed(self, dead: bool, delay: int) -> Statement:
        """One failed command: back off `delay` seconds, or dead-lettered; its attempts counted, its error kept."""
        t, backend = self.core.tables.outbox, self.core.backend
        then = {"state": DEAD, "available_at": backend.now()} if dead else {"available_at": backend.now_plus(delay)}
        return backend.prepared(("outbox failed", dead, 0 if dead else delay, t), lambda: statement(
            update(t).where(t.c.command_id == bindparam("id", type_=t.c.command_id.type),
                            t.c.claim_token == bindparam("token", type_=t.c.claim_token.type),
                            t.c.state == PENDING).values(
                attempts=t.c.attempts + 1, claim_token=null(), last_error=bindparam("error"), **then),
            Shape.ROWCOUNT, t))

    def _by_ids(self, name: str, slots: int, build: Any, *variant: Any) -> Statement:
        """A statement on the commands whose ids are bound as id_0 ... id_<slots-1> (unused ones NULL, which match
        nothing): one statement per batch size, compiled once, whatever the ids."""
        t, backend = self.core.tables.outbox, self.core.backend

        def make() -> Statement:
            ids = t.c.command_id.in_([bindparam(f"id_{i}", type_=t.c.command_id.type) for i in range(slots)])
            return statement(build(ids), Shape.ROWCOUNT, t)

        return backend.prepared(("outbox", name, slots, *variant, t), make)

    @staticmethod
    def _ids(ids: Sequence[str], slots: int) -> dict[str, Any]:
        return {f"id_{i}": ids[i] if i < len(ids) else None for i in range(slots)}

    # --- operations ------------------------------------------------------------------------------------------

    def stats(self) -> Flow[OutboxStats]:
        """Pending, published and dead-lettered commands and the oldest pending one's age: one read."""
        return self.core.retrying(lambda: transaction(self._stats()))

    def _stats(self) -> Flow[OutboxStats]:
        t, backend = self.core.tables.outbox, self.core.backend

        def count(state: int) -> ColumnElement[int]:
            return func.coalesce(func.sum(case((t.c.state == state, literal_column("1")), else_=literal_column("0"))),
                                 literal_column("0"))

        stmt = backend.prepared(("outbox stats", t), lambda: statement(select(
            count(PENDING).label("pending"), count(PUBLISHED).label("published"), count(DEAD).label("dead"),
            func.min(case((t.c.state == PENDING, t.c.created_at))).label("oldest"),
            backend.now().label("db_now")).select_from(t), Shape.ROW, t))
        row = yield from execute(stmt)
        return OutboxStats(_utc(row.db_now), int(row.pending), int(row.published), int(row.dead),
                           None if row.oldest is None else _utc(row.oldest))

    def requeue(self) -> Flow[int]:
        """Give every dead-lettered command a fresh start (pending, due now, no failed attempts): after the cause
        was fixed. Returns how many."""
        t, backend = self.core.tables.outbox, self.core.backend
        stmt = backend.prepared(("outbox requeue", t), lambda: statement(update(t).where(t.c.state == DEAD).values(
            state=PENDING, attempts=0, available_at=backend.now(), last_error=null()), Shape.ROWCOUNT, t))
        return self.core.retrying(lambda: transaction(rowcount(stmt)))


def _command(row: Any) -> Command:
    payload = bytes(row.payload)
    body = decode_response(payload)
    raw, content_type = ((body, "application/octet-stream") if isinstance(body, bytes)
                         else (payload[1:], "application/json"))
    return Command(id=row.command_id, destination=row.destination, payload=raw, content_type=content_type,
                   headers=decode_response(bytes(row.headers)), scope=row.scope, operation=row.operation,
                   key=row.idem_key, sequence=int(row.seq), attempts=int(row.attempts),
                   created_at=_utc(row.created_at))


def _error_text(error: str) -> str:
    """What is kept of an error: ASCII (every column type takes it), at most ERROR_LENGTH characters."""
    text = error.encode("ascii", "backslashreplace").decode("ascii").replace("\x00", "")
    return text[:ERROR_LENGTH] or "error"


def backoff(attempts: int, base: float, cap: float) -> int:
    """Whole seconds before the next attempt after `attempts` failures: doubling from `base`, at most `cap` (whole
    seconds, so the statements that schedule retries stay few: one per distinct delay)."""
    return int(max(1, min(cap, base * 2 ** max(0, attempts - 1))))


__all__ = ["MAX_BATCH", "Command", "Failure", "Outbox", "OutboxStats", "backoff"]
