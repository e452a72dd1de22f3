"""Copying what a change of placement moves, so that the store can drop its `Move` and route by the new placement
alone: the completed records of every moving scope, from its old shard to its new one, and the processed messages of
every shard that loses scopes to each shard that gains them (a message names no scope).

A flow of `OnShard` steps (each shard's statements in transactions of their own there), driven by both sharded
stores' loops. It waits, round after round, for the claims of moving scopes still live on their old shards to end;
an abandoned one (its lease over) is marked moved in its place, as a claim would mark it (`Claims.forward`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Table, and_, or_, select

from ..claims import MOVED, Claims
from ..core import Request
from ..dialects.base import binds, statement
from ..errors import ConfigurationError
from ..schema import MESSAGE_KEY_COLUMNS
from ..steps import Flow, Shape, Sleep, Statement, execute, transaction
from .onshard import on_shard
from .placement import Move

if TYPE_CHECKING:
    from .routing import ShardedClaims

T = TypeVar("T")


@dataclass
class MoveReport:
    """What `move_records` did. `done`: no claim of a moving scope is live on an old shard any more, every completed
    record of one is on its new shard, and the messages are copied: the store may route by `after` alone."""

    scopes: int = 0  # moving scopes found with records on their old shards
    copied: int = 0  # completed records copied to their new shard
    present: int = 0  # completed records their new shard had already (an earlier run's copies)
    marked: int = 0  # abandoned claims (lease over) marked moved on their old shard
    in_flight: int = 0  # claims still live on an old shard when the move stopped waiting (0 once done)
    messages: int = 0  # processed messages copied
    rounds: int = 0

    @property
    def done(self) -> bool:
        return self.in_flight == 0


def _page(claims: Claims, table: Table, limit: int, first: bool) -> Any:
    """The first `limit` records of one scope, or the next after (operation, idem_key): whole, with the database's
    clock. (The first page names no bound: an empty string is NULL on some engines.)"""
    t, backend = table, claims.core.backend
    after = binds(t, ("operation", "idem_key"), "a_")
    bound = or_(t.c.operation > after["operation"],
                and_(t.c.operation == after["operation"], t.c.idem_key > after["idem_key"]))
    return backend.prepared(("move page", t, limit, first), lambda: statement(
        select(*t.c, backend.now().label("db_now")).where(
            t.c.scope == binds(t, ("scope",), "k_")["scope"], *(() if first else (bound,)),
        ).order_by(t.c.operation, t.c.idem_key).limit(limit), Shape.ROWS, t))


def _distinct_scopes(table: Table) -> Statement:
    return statement(select(table.c.scope).distinct(), Shape.ROWS, table)


def _scopes(claims: Claims) -> Flow[list[tuple[Table, str]]]:
    """The scopes with records here, by table: the records and, where generations keep one, the previous generation
    (known once the transaction this runs in has refined the store)."""
    previous = claims.core.previous
    found = []
    for table in [claims.core.tables.records] + ([previous] if previous is not None else []):
        stmt = claims.core.backend.prepared(("move scopes", table), partial(_distinct_scopes, table))
        found += [(table, row[0]) for row in (yield from execute(stmt))]
    return found


def _copy(claims: Claims, rows: list[Any]) -> Flow[tuple[int, int]]:
    """Insert completed records (their stored answer as it is; their clock restarts here), keeping any already here."""
    backend, t = claims.core.backend, claims.core.tables.records
    copied = 0
    for row in rows:
        values = {"scope": row.scope, "operation": row.operation, "idem_key": row.idem_key,
                  "fingerprint": row.fingerprint, "claim_token": row.claim_token, "status": row.status,
                  "response": bytes(row.response)}
        copied += yield from backend.insert_if_absent(t, values, {"created_at": 0.0, "locked_until": 0.0,
                                                                  "completed_at": 0.0})
    return copied, len(rows) - copied


def _message_page(claims: Claims, limit: int, first: bool) -> Any:
    """The first `limit` processed messages, or the next after (subscriber, message_id)."""
    t = claims.core.tables.messages
    after = binds(t, MESSAGE_KEY_COLUMNS, "a_")
    bound = or_(t.c.subscriber > after["subscriber"],
                and_(t.c.subscriber == after["subscriber"], t.c.message_id > after["message_id"]))
    return claims.core.backend.prepared(("move messages", t, limit, first), lambda: statement(
        select(t.c.subscriber, t.c.message_id, t.c.fingerprint).where(*(() if first else (bound,)))
        .order_by(t.c.subscriber, t.c.message_id).limit(limit), Shape.ROWS, t))


def _copy_messages(claims: Claims, rows: list[Any]) -> Flow[int]:
    backend, t = claims.core.backend, claims.core.tables.messages
    copied = 0
    for row in rows:
        values = {"subscriber": row.subscriber, "message_id": row.message_id, "fingerprint": row.fingerprint}
        copied += yield from backend.insert_if_absent(t, values, {"processed_at": 0.0})
    return copied


def _in(shard: str, claims: Claims, body: Callable[..., Flow[T]], *args: Any) -> Flow[T]:
    """`body(*args)` in a transaction of its own on `shard`, within that shard's retry budget."""
    return on_shard(shard, claims.retrying(lambda: transaction(body(*args))), alone=True)


def move_records(sharded: ShardedClaims, batch_size: int, wait: timedelta, poll: float) -> Flow[MoveReport]:
    """See `ShardedStore.move_records`; refused before any SQL unless the store's chooser is a `Move`."""
    if not isinstance(sharded.chooser, Move):
        raise ConfigurationError("move_records() copies what a change of placement moves: give the store"
                                 " shard_chooser=Move(before=..., after=...) first")
    if batch_size < 1 or poll <= 0:
        raise ValueError(f"move_records() needs batch_size >= 1 and poll > 0, got {batch_size!r} and {poll!r}")
    return _moved(sharded, sharded.chooser, batch_size, wait.total_seconds(), poll)


def _moved(sharded: ShardedClaims, move: Move, batch_size: int, wait: float, poll: float) -> Flow[MoveReport]:
    report = MoveReport()
    waited = 0.0
    gains: dict[str, set[str]] = {}  # an old shard -> the shards its moving scopes go to
    while True:
        report.rounds += 1
        live = 0
        scopes: set[str] = set()
        for old, claims in sharded.shards.items():
            for table, scope in (yield from _in(old, claims, _scopes, claims)):
                if move.source(scope) != old:
                    continue
                scopes.add(scope)
                gains.setdefault(old, set()).add(sharded.shard(scope))
                live += yield from _move_scope(sharded, old, scope, table, batch_size, move.hold.total_seconds(),
                                               report)
        report.scopes, report.in_flight = len(scopes), live
        if live == 0 or waited >= wait:
            break
        yield Sleep(poll)
        waited += poll
    if report.done:
        for old, targets in gains.items():
            report.messages += yield from _move_messages(sharded, old, sorted(targets), batch_size)
    return report


def _move_scope(sharded: ShardedClaims, old: str, scope: str, table: Table, batch_size: int, hold: float,
                report: MoveReport) -> Flow[int]:
    """Copy one moving scope's completed records to its new shard and mark its abandoned claims; how many of its
    claims are still live on the old shard."""
    source, new = sharded.shards[old], sharded.shard(scope)
    target = sharded.shards[new]
    live, at = 0, {"k_scope": scope}
    while True:
        stmt = _page(source, table, batch_size, len(at) == 1)
        rows = yield from _in(old, source, execute, stmt, at)
        if not rows:
            return live
        at = {"k_scope": scope, "a_operation": rows[-1].operation, "a_idem_key": rows[-1].idem_key}
        done = [r for r in rows if r.completed_at is not None]
        for row in rows:
            if row.completed_at is not None or row.claim_token == MOVED:
                continue
            if row.locked_until > row.db_now:
                live += 1
                continue
            # Abandoned: marked moved in its place, fenced on its token, unless it changed meanwhile (then: live,
            # or completed and copied in the next round).
            req = Request(row.scope, row.operation, row.idem_key, row.fingerprint, None)
            outcome = yield from _in(old, source, source.forward, req, hold)
            if outcome is None:
                report.marked += 1
            else:
                live += 1
        if done:
            copied, present = yield from _in(new, target, _copy, target, done)
            report.copied += copied
            report.present += present


def _move_messages(sharded: ShardedClaims, old: str, targets: list[str], batch_size: int) -> Flow[int]:
    """Every processed message of shard `old`, copied to each of `targets`."""
    source, copied = sharded.shards[old], 0
    at: dict[str, str] = {}
    while True:
        stmt = _message_page(source, batch_size, not at)
        rows = yield from _in(old, source, execute, stmt, at)
        if not rows:
            return copied
        at = {"a_subscriber": rows[-1].subscriber, "a_message_id": rows[-1].message_id}
        for new in targets:
            target = sharded.shards[new]
            copied += yield from _in(new, target, _copy_messages, target, rows)
