"""`idem-dialects bench --api consumer`: messages per second of an idempotent consumer beside the same consumer
without the inbox, per broker, on each database.

- ``bare``: the consumer loop with the handler in a transaction of its own (begun the store's way), then the ack;
- ``idempotent``: the broker's adapter (`idem_dialects.consumers.<broker>`): the handler and the message's record in
  one transaction (`consume`), then the ack.

The handler inserts one row. Both modes hold the same number of messages at once (RabbitMQ prefetch, NATS fetch,
handled concurrently; Redis reads that many and handles them in turn): 20, or 1 on an engine whose writers take
turns on one lock (SQLite), where concurrent handlers only queue for it. Each round consumes a queue/stream of its own
holding `messages` unique messages, published beforehand; the time is from the first read until the last ack. Modes
alternate for `repetitions` rounds (after an unmeasured round of up to 200 messages each) and the report takes
medians. After the run the rows are counted: one per message and mode, or ExactlyOnceViolation. RabbitMQ and NATS
consume through the async store (their clients are asyncio), Redis through the sync store.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.engine import URL, Connection

from idem_dialects.aio import AsyncIdempotencyStore
from idem_dialects.cli.output import Log
from idem_dialects.conformance.brokers import BATCH, OPERATIONS, applied_table, in_flight
from idem_dialects.dialects.base import Backend
from idem_dialects.engines.brokers import BROKERS
from idem_dialects.store import IdempotencyStore

from .aio import async_url
from .report import engine_info, machine_info, new_prefix
from .runner import CannotMeasure, pool_options, reaching
from .workload import exactly_once

SCHEMA = "idem-dialects-bench-consumer/1"
MODES = ("bare", "idempotent")


@dataclass
class ConsumerBenchmark:
    """The consumer benchmark on each database, for the brokers named (every broker reachable here when none is)."""

    messages: int = 2000
    repetitions: int = 3
    broker: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.messages < 1 or self.repetitions < 1:
            raise ValueError("--messages and --repetitions must be at least 1")
        unknown = [b for b in self.broker if b not in BROKERS]
        if unknown:
            raise ValueError(f"unknown broker {unknown[0]!r}; known: {', '.join(BROKERS)}")
        missing = {b: why for b in self.broker if (why := BROKERS[b].unavailable())}
        if missing:
            raise CannotMeasure("; ".join(f"{b}: {why}" for b, why in missing.items()))

    def refuse(self, backend: type[Backend]) -> str | None:
        return None

    def measure(self, url: URL, log: Log) -> dict[str, Any]:
        chosen = self.broker or [b for b in BROKERS if BROKERS[b].unavailable() is None]
        skipped = {b: str(BROKERS[b].unavailable()) for b in BROKERS if b not in chosen and not self.broker}
        if not chosen:
            raise CannotMeasure("no broker is reachable here: " + "; ".join(f"{b}: {w}" for b, w in skipped.items()))
        prefix = new_prefix()
        with reaching(url):
            store = IdempotencyStore.from_url(url, table_prefix=prefix, **pool_options(url, BATCH + 2, 0))
        table = applied_table(prefix, store.tables.metadata)
        started = time.perf_counter()
        try:
            store.create_tables()
            with store.engine.connect() as conn:
                info = engine_info(store.engine.url, store.engine.dialect, store.backend.name,
                                   conn.dialect.server_version_info)
            info["async_driver"] = async_url(url, None).get_driver_name()  # RabbitMQ's and NATS's store
            results = {broker: self._broker(broker, url, store, log) for broker in chosen}
            with store.engine.connect() as conn:
                rows = conn.execute(select(table.c.message_id, func.count()).group_by(table.c.message_id)).all()
            expected = len(chosen) * len(MODES) * (self.repetitions * self.messages + self.warmup)
            once = exactly_once("messages applied", {str(m): int(n) for m, n in rows}, expected)
        finally:
            store.drop_tables()
            store.close()
        return {"schema": SCHEMA, "engine": info, "machine": machine_info(),
                "config": {"messages": self.messages, "repetitions": self.repetitions, "in_flight": in_flight(store)},
                "brokers": results, "skipped_brokers": skipped,
                "exactly_once": {"effects": once.effects, "distinct_messages": once.applied},
                "elapsed_s": round(time.perf_counter() - started, 2)}

    @property
    def warmup(self) -> int:
        """Messages per mode consumed unmeasured first (connections, statement caches)."""
        return min(self.messages, 200)

    def _broker(self, broker: str, url: URL, store: IdempotencyStore, log: Log) -> dict[str, Any]:
        runs: dict[str, list[float]] = {mode: [] for mode in MODES}
        for mode in MODES:
            self._round(broker, url, store, mode, f"{mode[0]}w-{secrets.token_hex(3)}", self.warmup)
        for rep in range(self.repetitions):
            for mode in MODES:
                tag = f"{mode[0]}{rep}-{secrets.token_hex(3)}"
                runs[mode].append(self._round(broker, url, store, mode, tag, self.messages))
                log(f"{broker} {mode} round {rep + 1}: {runs[mode][-1]:,.0f} messages/s")
        per_s = {mode: statistics.median(values) for mode, values in runs.items()}
        return {**{mode: {"per_s": round(per_s[mode], 1), "runs": [round(v, 1) for v in runs[mode]]}
                   for mode in MODES},
                "ratio_to_bare": round(per_s["idempotent"] / per_s["bare"], 3)}

    def _round(self, broker: str, url: URL, store: IdempotencyStore, mode: str, tag: str, count: int) -> float:
        """Messages per second of one mode on a fresh queue/stream holding `count` messages."""
        ops, broker_url, name = OPERATIONS[broker], BROKERS[broker].url(), f"bench_{tag.replace('-', '_')}"
        ops["setup"](broker_url, name)
        try:
            ops["publish"](broker_url, name, [(f"{tag}-{n}", b"{}") for n in range(count)])
            consume = {"rabbitmq": _rabbitmq, "nats": _nats, "redis": _redis}[broker]
            seconds = consume(Run(broker_url, name, url, store, mode == "idempotent", count, in_flight(store)))
        finally:
            ops["teardown"](broker_url, name)
        return count / seconds


@dataclass
class Run:
    """One timed consumption: where, on which store, with the inbox or not, how many messages."""

    broker_url: str
    name: str
    url: URL
    store: IdempotencyStore
    idempotent: bool
    messages: int
    in_flight: int

    def apply(self, conn: Connection, message_id: str) -> None:
        conn.execute(insert(self.store.tables.metadata.tables[f"{self.store.table_prefix}applied"])
                     .values(message_id=message_id, worker=0))


def _async_store(run: Run) -> AsyncIdempotencyStore:
    aurl = async_url(run.url, None)
    return AsyncIdempotencyStore.from_url(aurl, table_prefix=run.store.table_prefix,
                                          **pool_options(aurl, BATCH + 2, 0))


def _rabbitmq(run: Run) -> float:
    import aio_pika

    from idem_dialects.consumers.rabbitmq import IdempotentConsumer

    async def main() -> float:
        store, done, acked = _async_store(run), asyncio.Event(), [0]

        def count() -> None:
            acked[0] += 1
            if acked[0] == run.messages:
                done.set()

        async def handle(conn: Any, message: Any) -> None:
            await conn.run_sync(run.apply, message.message_id)

        idempotent = IdempotentConsumer(store, handle, subscriber="bench")

        async def callback(message: Any) -> None:
            if run.idempotent:
                await idempotent(message)
            else:
                async with store.transaction() as conn:
                    await handle(conn, message)
                await message.ack()
            count()

        async with await aio_pika.connect(run.broker_url) as connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=run.in_flight)
            queue = await channel.declare_queue(run.name, passive=True)
            started = time.perf_counter()
            await queue.consume(callback)
            await done.wait()
            seconds = time.perf_counter() - started
        await store.close()
        return seconds

    return asyncio.run(main())


def _nats(run: Run) -> float:
    import nats

    from idem_dialects.consumers.base import header
    from idem_dialects.consumers.nats import IdempotentConsumer

    async def main() -> float:
        store = _async_store(run)

        async def handle(conn: Any, msg: Any) -> None:
            await conn.run_sync(run.apply, msg.headers["Proof-Id"])

        idempotent = IdempotentConsumer(store, handle, subscriber="bench", message_id=header("Proof-Id"))

        async def bare(msg: Any) -> None:
            async with store.transaction() as conn:
                await handle(conn, msg)
            await msg.ack()

        callback = idempotent if run.idempotent else bare
        nc = await nats.connect(run.broker_url)
        sub = await nc.jetstream().pull_subscribe_bind("proof", stream=run.name)
        started, handled = time.perf_counter(), 0
        while handled < run.messages:
            msgs = await sub.fetch(run.in_flight, timeout=10)
            await asyncio.gather(*(callback(msg) for msg in msgs))
            handled += len(msgs)
        seconds = time.perf_counter() - started
        await nc.close()
        await store.close()
        return seconds

    return asyncio.run(main())


def _redis(run: Run) -> float:
    import redis

    from idem_dialects.consumers.redis import Entry, StreamConsumer, field

    client = redis.Redis.from_url(run.broker_url)

    def handle(conn: Connection, entry: Entry) -> None:
        run.apply(conn, entry.fields[b"id"].decode())

    consumer = StreamConsumer(run.store, client, handle, stream=run.name, group="proof", consumer="bench",
                              subscriber="bench", message_id=field("id"), batch=BATCH, block=1.0)
    poll: Callable[[], int] = consumer.poll if run.idempotent else lambda: _bare_redis(run, client, handle)
    started, handled = time.perf_counter(), 0
    while handled < run.messages:
        handled += poll()
    seconds = time.perf_counter() - started
    client.close()
    return seconds


def _bare_redis(run: Run, client: Any, handle: Callable[[Connection, Any], None]) -> int:
    from idem_dialects.consumers.redis import Entry

    replies = client.xreadgroup("proof", "bench", {run.name: ">"}, count=BATCH, block=1000)
    entries = [Entry(run.name, i.decode(), f, 1) for _, found in replies or [] for i, f in found]
    for entry in entries:
        with run.store.transaction() as conn:
            handle(conn, entry)
        client.xack(run.name, "proof", entry.id)
    return len(entries)
