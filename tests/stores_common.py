"""One script of what a user does with a store, run through every store type (tests/test_parity.py: the plain and
sharded stores, sync and async; tests/djangotests: DjangoStore). Its outcomes are written down so that two store types
can be compared, and docs/store-types.md's table names the features it covers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.engine import Connection

from idem_dialects import Claimed, InvalidKey
from idem_dialects.consumers import ConsumerBase
from idem_dialects.outbox import Command
from idem_dialects.outcomes import Disposition
from idem_dialects.relay import AsyncRelay, Relay

DONE = Table("script_done", MetaData(), Column("id", Integer, primary_key=True), Column("what", String(64)))
# What the script's effects leave behind, per store: every effect once.
EFFECTS = {"run0": 1, "run1": 1, "run2": 1, "leased": 1, "consumed": 1, "processed": 1, "commanded": 1}


class Side:
    """One side of a pair driven by one script: `call` runs what the side's API returns (a value, or a coroutine on
    the async side); `effect(body)` makes the side's effect from a sync body taking the sync Connection."""

    def __init__(self, asynchronous: bool) -> None:
        self.asynchronous = asynchronous
        self._loop = asyncio.new_event_loop() if asynchronous else None

    def call(self, value: Any) -> Any:
        return self._loop.run_until_complete(value) if self._loop is not None else value

    def effect(self, body: Callable[[Connection], Any]) -> Callable[[Any], Any]:
        if not self.asynchronous:
            return body

        async def effect(conn: Any) -> Any:
            return await conn.run_sync(body)

        return effect

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()


def effects(conn: Connection) -> dict[str, int]:
    """How often each of the script's effects committed, read on `conn`."""
    return {str(w): int(n) for w, n in conn.execute(select(DONE.c.what, func.count()).group_by(DONE.c.what))}


class _Collect:
    def __init__(self) -> None:
        self.seen: list[Command] = []

    def publish(self, command: Command) -> None:
        self.seen.append(command)


def store_script(store: Any, side: Side, scope: Callable[[int], str]) -> list[Any]:
    """What a user does with a store, the outcomes written down: run (atomic, leased), a replay, a mismatch, the
    step-by-step API (claim, complete, release, accept_message), consume and a consumer's processing, the outbox and
    a relay, stats and purge, and an identity refused before any SQL. `scope(n)`: the n-th tenant."""
    seen: list[Any] = []

    def done(what: str) -> Callable[[Any], Any]:
        def body(conn: Connection) -> Any:
            conn.execute(insert(DONE).values(what=what))
            return {"what": what, "total": Decimal("1.50")}
        return side.effect(body)

    for n in range(3):
        first = side.call(store.run(scope=scope(n), operation="op", key=f"k{n}", request={"n": n},
                                    effect=done(f"run{n}")))
        again = side.call(store.run(scope=scope(n), operation="op", key=f"k{n}", request={"n": n},
                                    effect=done(f"run{n}")))
        seen.append((first.response, first.replayed, again.response, again.replayed))
    try:
        side.call(store.run(scope=scope(0), operation="op", key="k0", request={"n": 9}, effect=done("never")))
    except Exception as exc:
        seen.append(type(exc).__name__)
    for _ in range(2):
        leased = side.call(store.run(scope=scope(1), operation="op", key="lease", request={}, effect=done("leased"),
                                     lease=timedelta(seconds=30)))
        seen.append((leased.response, leased.replayed))
    for attempt in range(2):
        delivery = side.call(store.consume(subscriber="sub", message_id="m1", payload={"p": 1},
                                           handler=done("consumed"), scope=scope(1)))
        seen.append((attempt, delivery.disposition, delivery.duplicate))
    consumer = ConsumerBase(subscriber="adapter", on_mismatch=Disposition.DEAD_LETTER, max_deliveries=2,
                            retry_delay=0, compare_payload=True, scope=lambda message: message["tenant"])
    process = consumer.aprocess if side.asynchronous else consumer.process
    message = {"tenant": scope(2), "id": "m2"}
    for deliveries in (1, 2):
        seen.append(side.call(process(store, message["id"], message, done("processed"), deliveries, message)))
    seen.append(dict(consumer.counts))
    seen.append(side.call(store.run(scope=scope(2), operation="cmd", key="c1", request={},
                                    effect=_commanding(store, side))).response)
    published = _Collect()
    relay = (AsyncRelay if side.asynchronous else Relay)(store, {"*": published}, stats_every=0)
    seen.append((side.call(relay.run_once()), side.call(relay.run_once()), [c.destination for c in published.seen]))
    seen.append(side.call(_stepwise_async(store, scope(0))) if side.asynchronous else _stepwise(store, scope(0)))
    stats = side.call(store.stats())
    seen.append((stats.completed, stats.in_flight, stats.messages))
    seen.append(side.call(store.purge(older_than=timedelta(0))))
    with pytest.raises(InvalidKey, match="1700 bytes"):
        wide = "\U0001f600" * 255  # 1,020 bytes: three of them exceed the 1,700-byte identity limit
        side.call(store.run(scope=wide, operation=wide, key=wide, request={}, effect=done("never")))
    return seen


def _commanding(store: Any, side: Side) -> Callable[[Any], Any]:
    def write(conn: Connection) -> str:
        conn.execute(insert(DONE).values(what="commanded"))
        return "ok"

    if not side.asynchronous:
        def effect(conn: Connection) -> str:
            store.add_command(conn, "dest", {"hello": 1})
            return write(conn)
        return effect

    async def aeffect(conn: Any) -> str:
        await store.add_command(conn, "dest", {"hello": 1})
        return await conn.run_sync(write)  # type: ignore[no-any-return]
    return aeffect


def _stepwise(store: Any, scope: str) -> tuple[str, ...]:
    with store.transaction(scope=scope) as conn:
        outcome = store.claim(conn, scope=scope, operation="step", key="s1", request={})
        assert isinstance(outcome, Claimed)
        store.complete(conn, outcome, {"step": 1}, status=201)
        other = store.claim(conn, scope=scope, operation="step", key="s2", request={})
        released = store.release(conn, other)
        accepted = (store.accept_message(conn, subscriber="step", message_id="x", payload=1),
                    store.accept_message(conn, subscriber="step", message_id="x", payload=1))
    return type(outcome).__name__, str(released), *map(str, accepted)


async def _stepwise_async(store: Any, scope: str) -> tuple[str, ...]:
    async with store.transaction(scope=scope) as conn:
        outcome = await store.claim(conn, scope=scope, operation="step", key="s1", request={})
        assert isinstance(outcome, Claimed)
        await store.complete(conn, outcome, {"step": 1}, status=201)
        other = await store.claim(conn, scope=scope, operation="step", key="s2", request={})
        released = await store.release(conn, other)
        accepted = (await store.accept_message(conn, subscriber="step", message_id="x", payload=1),
                    await store.accept_message(conn, subscriber="step", message_id="x", payload=1))
    return type(outcome).__name__, str(released), *map(str, accepted)
