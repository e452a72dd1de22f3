"""Checks: the transactional outbox on one engine. Commands commit with the record and the business write or not at
all, a replay adds none; relays claim with the engine's skip-locked read, so concurrent relays never take one command
twice, a relay killed between publishing and marking loses nothing, a scope's commands go out in order; failures back
off and dead-letter; published commands leave with retention."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from idem_dialects import Claimed, IdempotencyStore, Reply
from idem_dialects.ids import command_id, derive
from idem_dialects.outbox import Command
from idem_dialects.relay import Relay
from idem_dialects.schema import DEAD, PENDING, PUBLISHED
from idem_dialects.steps import transaction

from .support import Effects

Observe = Callable[[str, object], None]
# How long a relay holding its claim waits to be released: a claim that waited for its locks returns only after it.
HOLD = 60.0


class Killed(BaseException):
    """The relay's process dying: nothing after it runs (no mark), as under SIGKILL."""


class Recorder:
    """A publisher that keeps what it was given; `fail` ids raise; `die_after` publishes then dies."""

    def __init__(self, fail: set[str] | None = None, die_after: int | None = None) -> None:
        self.seen: list[Command] = []
        self.fail = fail or set()
        self.die_after = die_after
        self.lock = threading.Lock()

    def publish(self, command: Command) -> None:
        if command.id in self.fail:
            raise ConnectionAbortedError("refused by the test")
        with self.lock:
            self.seen.append(command)
            if self.die_after is not None and len(self.seen) >= self.die_after:
                raise Killed

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.seen]


def relay(store: Any, publisher: Any, **options: Any) -> Any:
    """A relay of the store's kind: Relay on a sync store, AsyncRelay behind the bridge on an async one."""
    options.setdefault("stats_every", 0)
    if hasattr(store, "relay"):
        return store.relay({"*": publisher}, **options)
    return Relay(store, {"*": publisher}, **options)


def drain(r: Any) -> int:
    total = 0
    while (n := r.run_once()):
        total += n
    return total


def states(store: IdempotencyStore) -> Counter[int]:
    t = store.tables.outbox
    with store.engine.connect() as conn:
        return Counter(int(s) for (s,) in conn.execute(select(t.c.state)))


def write(store: IdempotencyStore, scopes: int, per_scope: int, commands: int = 1, first: int = 0) -> list[str]:
    """Requests of `scopes` scopes, `per_scope` each (numbered from `first`), one after another, each writing
    `commands` commands."""
    ids = []
    for n in range(first, first + per_scope):
        for s in range(scopes):
            def effect(conn: Any, s: int = s, n: int = n) -> Any:
                return [store.add_command(conn, "dest", {"scope": s, "n": n, "i": i}) for i in range(commands)]

            ids += store.run(scope=f"scope-{s}", operation="op", key=f"k{s}-{n}", request={}, effect=effect).response
    return ids


@pytest.mark.idem_stack
def test_outbox_commands_commit_with_the_record(idem_store: IdempotencyStore, idem_effects: Effects) -> None:
    """Commands an effect writes commit with its record and business write, carry ids derived from the record and
    their sequence, vanish with a rolled-back effect, and a replay adds none."""
    def effect(conn: Any) -> Any:
        idem_effects.apply(conn, "k")
        return [idem_store.add_command(conn, "orders", {"n": 1}), idem_store.add_command(conn, "orders", b"raw",
                                                                                          {"X-Trace": "t"})]

    def failing(conn: Any) -> Any:
        effect(conn)
        raise RuntimeError("after writing its commands")

    with pytest.raises(RuntimeError):
        idem_store.run(scope="acct:1", operation="debit:v1", key="k", request={}, effect=failing)
    assert states(idem_store) == Counter() and idem_effects.count() == 0
    first = idem_store.run(scope="acct:1", operation="debit:v1", key="k", request={}, effect=effect)
    again = idem_store.run(scope="acct:1", operation="debit:v1", key="k", request={}, effect=effect)
    assert again.replayed and again.response == first.response
    assert first.response == [command_id("acct:1", "debit:v1", "k", 0), command_id("acct:1", "debit:v1", "k", 1)]
    assert states(idem_store) == Counter({PENDING: 2}) and idem_effects.count() == 1
    seen = Recorder()
    assert drain(relay(idem_store, seen)) == 2
    assert seen.ids == first.response  # one scope: in the order the effect wrote them
    assert seen.seen[0].json() == {"n": 1} and seen.seen[0].content_type == "application/json"
    assert seen.seen[1].payload == b"raw" and dict(seen.seen[1].headers) == {"X-Trace": "t"}
    assert (seen.seen[0].scope, seen.seen[0].operation, seen.seen[0].key, seen.seen[1].sequence) == (
        "acct:1", "debit:v1", "k", 1)


def test_outbox_consumer_handler_commands(idem_store: IdempotencyStore) -> None:
    """A consumer's handler writes commands in the transaction that records the message; a redelivery adds none."""
    def handler(conn: Any) -> Any:
        return idem_store.add_command(conn, "next", {"from": "m-1"})

    first = idem_store.consume(subscriber="billing", message_id="m-1", handler=handler)
    again = idem_store.consume(subscriber="billing", message_id="m-1", handler=handler)
    assert again.duplicate and first.value == derive("message", "billing", "message", "m-1", 0)
    assert states(idem_store) == Counter({PENDING: 1})


def test_outbox_leased_run_and_step_by_step(idem_store: IdempotencyStore) -> None:
    """A leased run's effect writes commands with its completion; the step-by-step API names origin and sequence."""
    result = idem_store.run(scope="s", operation="op", key="leased", request={}, lease=timedelta(seconds=30),
                            effect=lambda conn: Reply(idem_store.add_command(conn, "d", {}), 201))
    assert result.response == command_id("s", "op", "leased", 0)
    with idem_store.transaction() as conn:
        claimed = idem_store.claim(conn, scope="s", operation="op", key="steps", request={})
        assert isinstance(claimed, Claimed)
        written = idem_store.add_command(conn, "d", {"a": 1}, origin=claimed, sequence=0)
        idem_store.complete(conn, claimed, {"ok": True})
    assert written == command_id("s", "op", "steps", 0)
    assert states(idem_store) == Counter({PENDING: 2})


def test_outbox_relay_killed_between_publish_and_mark_loses_nothing(idem_store: IdempotencyStore,
                                                                     idem_observe: Observe) -> None:
    """A relay that dies after publishing, before marking, loses no command: once its lease ends another relay
    publishes them again under the same ids (what the receiving inbox deduplicates), and marks them."""
    ids = write(idem_store, scopes=6, per_scope=2)
    dying = Recorder(die_after=4)
    with pytest.raises(Killed):
        relay(idem_store, dying, lease=1.0, ordered=False).run_once()
    assert states(idem_store) == Counter({PENDING: 12})  # nothing marked
    survivor = Recorder()
    second = relay(idem_store, survivor, lease=1.0, ordered=False)
    published_early = drain(second)  # the dead relay's batch is leased for a second more
    time.sleep(1.3)
    drain(second)
    assert sorted(survivor.ids) == sorted(ids) and states(idem_store) == Counter({PUBLISHED: 12})
    again = set(dying.ids) & set(survivor.ids)
    assert again == set(dying.ids)  # published twice, each time under the same id
    idem_observe("relay killed between publish and mark", f"{len(again)} commands published again under their ids,"
                                                           f" {published_early} others not waiting for the lease")


@pytest.mark.idem_stack
@pytest.mark.idem_requires("concurrent_connections")
def test_outbox_concurrent_relays_never_take_one_command_twice(idem_store: IdempotencyStore,
                                                               idem_observe: Observe) -> None:
    """Four relays draining one outbox at once (the engine's skip-locked claim) publish every command exactly
    once while their leases hold."""
    ids = write(idem_store, scopes=40, per_scope=3)
    seen = Recorder()
    relays = [relay(idem_store, seen, batch=10, ordered=False, lease=60) for _ in range(4)]
    barrier = threading.Barrier(len(relays))
    errors: list[BaseException] = []

    def go(r: Any) -> None:
        barrier.wait()
        try:
            for _ in range(200):
                r.run_once()
                if len(seen.seen) >= len(ids):
                    return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(r,)) for r in relays]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    counts = Counter(seen.ids)
    assert sorted(counts) == sorted(ids) and max(counts.values()) == 1
    assert states(idem_store) == Counter({PUBLISHED: len(ids)})
    shares = sorted((r.metrics.published for r in relays), reverse=True)
    idem_observe("4 concurrent relays", f"{len(ids)} commands, each published once; shares {shares}")


def test_outbox_relays_keep_each_scope_in_order(idem_store: IdempotencyStore) -> None:
    """Ordered relays (the default), two taking turns, publish each scope's commands in the order they were
    written, a request's own commands included."""
    write(idem_store, scopes=3, per_scope=4, commands=2)
    seen = Recorder()
    relays = [relay(idem_store, seen, batch=5), relay(idem_store, seen, batch=5)]
    while sum(r.run_once() for r in relays):
        pass
    assert len(seen.seen) == 24
    for scope in range(3):
        mine = [(c.json()["n"], c.json()["i"]) for c in seen.seen if c.scope == f"scope-{scope}"]
        assert mine == sorted(mine) and len(mine) == 8


def test_outbox_failed_publishes_back_off_then_dead_letter(idem_store: IdempotencyStore) -> None:
    """A failing publish is retried after a backoff (not at once), its error kept, and dead-lettered after
    max_attempts; a dead command no longer holds back its scope; requeue makes it pending again."""
    ids = write(idem_store, scopes=1, per_scope=2)
    seen = Recorder(fail={ids[0]})
    r = relay(idem_store, seen, max_attempts=2, backoff_base=1.0, backoff_cap=1.0)
    assert r.run_once() == 0 and r.run_once() == 0  # backing off: nothing due, the scope's second waits
    time.sleep(1.3)
    assert r.run_once() == 0  # second failure: dead-lettered
    assert drain(r) == 1 and seen.ids == [ids[1]]
    assert states(idem_store) == Counter({DEAD: 1, PUBLISHED: 1})
    t = idem_store.tables.outbox
    with idem_store.engine.connect() as conn:
        row = conn.execute(select(t.c.attempts, t.c.last_error).where(t.c.command_id == ids[0])).one()
    assert row.attempts == 2 and "ConnectionAbortedError" in row.last_error
    assert idem_store.drive(idem_store.outbox.requeue()) == 1
    seen.fail.clear()
    assert drain(r) == 1 and states(idem_store) == Counter({PUBLISHED: 2})


def test_outbox_published_commands_leave_with_retention(idem_store: IdempotencyStore) -> None:
    """Purge removes published commands older than the window, never pending or dead-lettered ones."""
    write(idem_store, scopes=2, per_scope=1)
    idem_store.purge(older_than=timedelta(0))
    assert states(idem_store) == Counter({PENDING: 2})  # waiting commands stay, however old
    drain(relay(idem_store, Recorder()))
    write(idem_store, scopes=1, per_scope=1, first=1)  # pending
    time.sleep(0.05)
    idem_store.purge(older_than=timedelta(0))
    assert states(idem_store) == Counter({PENDING: 1})
    stats = idem_store.drive(idem_store.outbox.stats())
    assert (stats.pending, stats.published, stats.dead) == (1, 0, 0) and stats.oldest_pending_age >= 0


@pytest.mark.idem_stack
@pytest.mark.idem_requires("concurrent_connections", "exclusive_claim")
def test_outbox_claim_skips_rows_another_relay_holds(idem_store: IdempotencyStore) -> None:
    """While one relay's claim transaction holds its batch locked, another relay's claim takes the next commands
    at once, neither waiting for the lock nor taking a held one (one writer at a time: the second waits for the
    write lock, then finds the first's leases). Where row locks are a node's own (Galera with every node writing),
    two relays may take one command; the first to commit its lease wins and the other's rolls back (the check of
    concurrent relays above shows each command still published once)."""
    write(idem_store, scopes=4, per_scope=1)
    holding, release = threading.Event(), threading.Event()
    first: list[Any] = []
    outwaited: list[bool] = []  # the holder's wait ran out before it was released: the second claim waited for it

    def hold(commands: list[Any]) -> Any:
        first.extend(commands)
        holding.set()
        outwaited.append(not release.wait(HOLD))
        return commands
        yield  # pragma: no cover - a flow

    def claim_and_hold() -> Any:
        # The claim flow, its transaction held open after the rows are locked and leased.
        commands = yield from own.outbox._claim("holder", 2, 60.0, False)
        return (yield from hold(commands))

    own = getattr(idem_store, "sync", idem_store)  # behind the bridge, the same flows on a sync connection of its own
    holder = threading.Thread(target=lambda: own.drive(transaction(claim_and_hold())))
    holder.start()
    try:
        assert holding.wait(30)
        if idem_store.features.writers == 1:
            release.set()
        second = idem_store.drive(idem_store.outbox.claim("other", 2, 60.0, False))
    finally:
        release.set()  # only now, after the second claim returned, does the first let its locks go
        holder.join(HOLD)
    assert {c.id for c in second}.isdisjoint({c.id for c in first}) and len(second) == 2
    if idem_store.features.writers != 1:
        assert outwaited == [False], f"the second claim waited for the first's locks ({HOLD:g} s, until it gave up)"
