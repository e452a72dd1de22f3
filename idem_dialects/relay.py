"""Relays: publish the outbox's commands to the systems they are for, each exactly as often as it takes, under its
stable id. `Relay` for sync code and a sync store, `AsyncRelay` for asyncio; the decisions are made once, here, and
the database work is the outbox's flows (`outbox.py`), which both loops drive through their store.

One round: claim a batch of due commands (the backend's skip-locked read, leased to this relay for `lease`
seconds), publish each to the publisher its destination routes to, then mark them in one transaction: published;
failed (retried after a doubling backoff, dead-lettered after `max_attempts` failures, or at once if the publisher
raises `Rejected`); or given back untried when a destination is down (`Unreachable`, which costs no attempt and
pauses the relay). A relay killed anywhere loses nothing: its lease ends and another relay (or itself, restarted)
publishes the commands again under the same ids, which the receiving inbox (`idem_dialects.consumers`, or the HTTP
middleware behind an ``Idempotency-Key``) deduplicates.

Ordering: with `ordered` (the default), a claim takes only the oldest waiting command of each scope, so a scope's
commands are published one after another in the order their effects wrote them, however many relays run. Whether
the receiver *processes* them in that order is the destination's matter (docs: outbox).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from .api import AsyncStoreAPI, StoreAPI
from .errors import IdemError
from .outbox import Command, Failure, OutboxStats, backoff

log = logging.getLogger("idem_dialects.relay")
S = TypeVar("S", "StoreAPI[Any]", "AsyncStoreAPI[Any]")  # the store a relay drives: sync (Relay) or async


class Rejected(Exception):
    """Raise from a publisher: the destination refused this command for good (malformed, forbidden); dead-letter
    it now instead of after `max_attempts`."""


class Unreachable(Exception):
    """Raise from a publisher: the destination cannot be reached now (connection refused, broker down). The command
    is given back without costing an attempt, and the relay pauses before its next round."""


class Publisher(Protocol):
    """Publishes one command, returning once the destination has it (a broker's confirm, an HTTP 2xx)."""

    def publish(self, command: Command) -> None: ...


class AsyncPublisher(Protocol):
    async def publish(self, command: Command) -> None: ...


AnyPublisher = Publisher | AsyncPublisher
DEFAULT_ROUTE = "*"


@dataclass
class RelayMetrics:
    """What a relay did since it started, and the backlog it last sampled."""

    outcomes: Counter[str] = field(default_factory=Counter)  # published, retried, dead_lettered, released
    rounds: int = 0
    started: float = field(default_factory=time.monotonic)
    pending: int | None = None
    oldest_pending_age: float | None = None

    @property
    def published(self) -> int:
        return self.outcomes["published"]

    @property
    def published_per_second(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.published / elapsed if elapsed > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**dict(self.outcomes), "rounds": self.rounds, "published_per_second": self.published_per_second,
                "pending": self.pending, "oldest_pending_age_seconds": self.oldest_pending_age}


@dataclass(frozen=True)
class Round:
    """How one round's commands ended: the marks to settle, and whether a destination was down."""

    published: list[str]
    failed: list[Failure]
    released: list[str]
    unreachable: bool


class _Relaying(Generic[S]):
    """The options and decisions both loops share."""

    def __init__(self, store: S, routes: Mapping[str, AnyPublisher], *, batch: int = 100, lease: float = 30.0,
                 max_attempts: int = 10, backoff_base: float = 1.0, backoff_cap: float = 300.0, ordered: bool = True,
                 idle: float = 0.5, stats_every: float = 10.0, name: str | None = None) -> None:
        if not routes:
            raise IdemError("a relay needs at least one route: {destination: publisher} ('*' for any destination)")
        if batch < 1 or lease <= 0 or max_attempts < 1 or backoff_base <= 0 or backoff_cap < backoff_base:
            raise ValueError("batch >= 1, lease > 0, max_attempts >= 1 and 0 < backoff_base <= backoff_cap")
        self.store: S = store
        self.routes = dict(routes)
        self.batch, self.lease, self.max_attempts = batch, lease, max_attempts
        self.backoff_base, self.backoff_cap, self.ordered = backoff_base, backoff_cap, ordered
        self.idle, self.stats_every = idle, stats_every
        self.name = name or f"relay-{uuid.uuid4().hex[:8]}"
        self.token = uuid.uuid4().hex  # this relay's leases
        self.metrics = RelayMetrics()
        self._sampled = 0.0
        self._unreachable = False  # a destination was down in the last round

    def route(self, command: Command) -> AnyPublisher | None:
        return self.routes.get(command.destination) or self.routes.get(DEFAULT_ROUTE)

    def decide(self, commands: Sequence[Command], results: Sequence[BaseException | None]) -> Round:
        published, failed, released, unreachable = [], [], [], False
        telemetry = self.store.outbox.telemetry
        for command, error in zip(commands, results, strict=True):
            if error is None:
                published.append(command.id)
                outcome = "published"
            elif isinstance(error, Unreachable):
                released.append(command.id)
                unreachable, outcome = True, "released"
            else:
                attempts = command.attempts + 1
                dead = isinstance(error, Rejected) or attempts >= self.max_attempts
                text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                failed.append(Failure(command.id, text, dead, backoff(attempts, self.backoff_base, self.backoff_cap)))
                outcome = "dead_lettered" if dead else "retried"
                log.log(logging.ERROR if dead else logging.WARNING, "%s: publishing command %s to %r failed (%s);"
                        " %s", self.name, command.id, command.destination, text,
                        "dead-lettered" if dead else f"attempt {attempts} of {self.max_attempts}")
            self.metrics.outcomes[outcome] += 1
            telemetry.relayed(command.destination, outcome)
        self.metrics.rounds += 1
        return Round(published, failed, released, unreachable)

    def sampled(self, stats: OutboxStats) -> None:
        self.metrics.pending, self.metrics.oldest_pending_age = stats.pending, stats.oldest_pending_age
        self.store.outbox.telemetry.backlog(self.store.outbox.table, stats.pending, stats.oldest_pending_age)

    def due_for_stats(self) -> bool:
        now = time.monotonic()
        if self.stats_every <= 0 or now - self._sampled < self.stats_every:
            return False
        self._sampled = now
        return True


def _failed(command: Command) -> BaseException:
    return Rejected(f"no publisher for destination {command.destination!r}")


class Relay(_Relaying[StoreAPI[Any]]):
    """Publishes the outbox of a sync store (IdempotencyStore, a Django store, a ShardedStore: every shard's). `routes`
    maps a destination (or '*') to a publisher; an async publisher (RabbitMQ's, NATS's) runs on an event loop of the
    relay's own thread. `run(stop)` until `stop` is set, or `run_once()` from a loop of your own."""

    _loop: asyncio.AbstractEventLoop | None = None  # the async publishers' (started by the first of them)
    _thread: threading.Thread | None = None

    def run_once(self) -> int:
        """One round; how many commands it published."""
        drive, outbox = self.store.drive, self.store.outbox
        if self.due_for_stats():
            self.sampled(drive(outbox.stats()))
        commands = drive(outbox.claim(self.token, self.batch, self.lease, self.ordered))
        if not commands:
            return 0
        results: list[BaseException | None] = []
        down: set[str] = set()
        for command in commands:
            if command.destination in down:
                results.append(Unreachable("destination down this round"))
                continue
            error = self._publish(command)
            if isinstance(error, Unreachable):
                down.add(command.destination)
            results.append(error)
        done = self.decide(commands, results)
        drive(outbox.settle(self.token, done.published, done.failed, done.released))
        self._unreachable = done.unreachable
        return len(done.published)

    def _publish(self, command: Command) -> BaseException | None:
        publisher = self.route(command)
        if publisher is None:
            return _failed(command)
        try:
            if inspect.iscoroutinefunction(publisher.publish):
                asyncio.run_coroutine_threadsafe(publisher.publish(command), self._event_loop()).result()
            else:
                publisher.publish(command)
        except Exception as exc:
            return exc
        return None

    def run(self, stop: threading.Event | None = None) -> None:
        """Rounds until `stop` is set: at once while there is work, after `idle` seconds when there is none, after
        a doubling pause while a destination or the database is down."""
        stop = stop or threading.Event()
        pause = self.idle
        try:
            while not stop.is_set():
                self._unreachable = False
                try:
                    busy = self.run_once() > 0 or self._unreachable
                except Exception as exc:  # the database, beyond the store's retry budget: wait and try again
                    log.warning("%s: a round failed (%s); retrying in %.1f s", self.name, type(exc).__name__, pause)
                    busy, self._unreachable = False, True
                if self._unreachable:
                    stop.wait(pause)
                    pause = min(pause * 2, 30.0)
                    continue
                pause = self.idle
                if not busy:
                    stop.wait(self.idle)
        finally:
            self.close()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name=f"{self.name}-loop", daemon=True)
            self._thread.start()
        return self._loop

    def close(self) -> None:
        """Close the publishers' connections, and stop the async publishers' event loop if one was started."""
        for publisher in self.routes.values():
            close = getattr(publisher, "close", None)
            try:
                if not inspect.iscoroutinefunction(close):
                    if callable(close):
                        close()
                elif self._loop is not None:  # an async publisher never used opened nothing
                    asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            except Exception as exc:  # closing what may be broken already: the others are closed all the same
                log.debug("%s: closing a publisher failed: %s", self.name, type(exc).__name__)
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
            self._loop = self._thread = None


class AsyncRelay(_Relaying[AsyncStoreAPI[Any]]):
    """Publishes the outbox of an async store (AsyncIdempotencyStore, an AsyncShardedStore: every shard's): a round's
    commands are published concurrently (each scope has at most one in a round when `ordered`). A sync publisher is
    called in a worker thread."""

    async def run_once(self) -> int:
        """One round; how many commands it published."""
        if self.due_for_stats():
            self.sampled(await self.store.drive(self.store.outbox.stats()))
        commands = await self.store.drive(self.store.outbox.claim(self.token, self.batch, self.lease, self.ordered))
        if not commands:
            return 0
        results = await asyncio.gather(*(self._publish(c) for c in commands))
        done = self.decide(commands, results)
        await self.store.drive(self.store.outbox.settle(self.token, done.published, done.failed, done.released))
        self._unreachable = done.unreachable
        return len(done.published)

    async def _publish(self, command: Command) -> BaseException | None:
        publisher = self.route(command)
        if publisher is None:
            return _failed(command)
        try:
            if inspect.iscoroutinefunction(publisher.publish):
                await publisher.publish(command)
            else:
                await asyncio.to_thread(publisher.publish, command)
        except Exception as exc:
            return exc
        return None

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Rounds until `stop` is set (see `Relay.run`)."""
        try:
            await self._rounds(stop or asyncio.Event())
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the publishers' connections."""
        for publisher in self.routes.values():
            close = getattr(publisher, "close", None)
            try:
                if inspect.iscoroutinefunction(close):
                    await close()
                elif callable(close):
                    close()
            except Exception as exc:  # closing what may be broken already: the others are closed all the same
                log.debug("%s: closing a publisher failed: %s", self.name, type(exc).__name__)

    async def _rounds(self, stop: asyncio.Event) -> None:
        pause = self.idle
        while not stop.is_set():
            self._unreachable = False
            try:
                busy = await self.run_once() > 0 or self._unreachable
            except Exception as exc:
                log.warning("%s: a round failed (%s); retrying in %.1f s", self.name, type(exc).__name__, pause)
                busy, self._unreachable = False, True
            wait = pause if self._unreachable else (0.0 if busy else self.idle)
            pause = min(pause * 2, 30.0) if self._unreachable else self.idle
            if wait:
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                except TimeoutError:
                    pass


__all__ = ["DEFAULT_ROUTE", "AsyncPublisher", "AsyncRelay", "Publisher", "Rejected", "Relay", "RelayMetrics",
           "Unreachable"]
