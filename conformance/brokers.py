"""Each broker as the consumer proof drives it: a queue/stream of its own per run, publishing (confirmed, so nothing
is lost on the way in), what is left on the broker at the end, what was dead-lettered, and a worker loop that runs
the real adapter (`idem_dialects.consumers.<broker>`) against a database until it is told to stop.

A worker can be told to kill itself (SIGKILL) at a point no outside signal hits reliably: ``mid-handler`` (the
effect written, not committed) or ``after-commit`` (committed, not yet acknowledged: the adapter's ack is patched
in the worker's process only).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, insert

from idem_dialects.url import async_url, parse

ACK_WAIT = 2.0  # seconds before a broker redelivers what a killed consumer held (NATS ack wait, Redis claim idle)
BATCH = 20  # messages a worker holds at once (RabbitMQ prefetch, NATS fetch, Redis read count)


def in_flight(store: Any) -> int:
    """Messages handled at once: one per writer the engine allows (SQLite: 1; concurrent handlers would only queue
    for its write lock), up to BATCH."""
    return min(BATCH, store.features.writers or BATCH)


def applied_table(prefix: str, metadata: MetaData | None = None) -> Table:
    """One row per handler run that committed; no unique key, so a second run of a message would show."""
    return Table(f"{prefix}applied", metadata or MetaData(), Column("message_id", String(64), nullable=False),
                 Column("worker", Integer, nullable=False))


@dataclass
class Kill:
    """Kill this process at `point` ("mid-handler" or "after-commit") of its `at`-th message."""

    point: str
    at: int
    seen: int = 0

    def due(self, point: str) -> bool:
        if point != self.point:
            return False
        self.seen += 1
        return self.seen == self.at


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Journal(Counter[str]):
    """The adapter's `counts`, each increment also appended to a file at once (a killed worker keeps its tally)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __setitem__(self, key: str, value: int) -> None:
        if value > self.get(key, 0):
            os.write(self._fd, f"{key}\n".encode())
        super().__setitem__(key, value)


@dataclass(frozen=True)
class Worker:
    """What a worker process is given: where the broker, the queue and the database are, and its kill."""

    broker: str
    broker_url: str
    name: str  # queue / stream / subject name of this run
    db_url: str
    prefix: str
    number: int
    journal: str
    ready: str  # a file the worker creates once it is consuming
    kill: Kill | None = None
    id_header: str = "Proof-Id"  # NATS: the header the id travels in (the outbox proof's relays use Nats-Msg-Id)


def handler_effect(table: Table, worker: Worker) -> Callable[[Any, str], None]:
    def apply(conn: Any, message_id: str) -> None:
        conn.execute(insert(table).values(message_id=message_id, worker=worker.number))
        if worker.kill is not None and worker.kill.due("mid-handler"):
            die()

    return apply


def after_commit(worker: Worker, cls: type, method: str) -> None:
    """Patch `cls.method` (the adapter's acknowledgement) to kill this process first at the planned message."""
    kill = worker.kill
    if kill is None or kill.point != "after-commit":
        return
    original = getattr(cls, method)

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kill.due("after-commit"):
            die()
        return original(self, *args, **kwargs)

    setattr(cls, method, patched)


def run_worker(worker: Worker, stop: threading.Event) -> None:
    {"rabbitmq": _rabbitmq_worker, "nats": _nats_worker, "redis": _redis_worker}[worker.broker](worker, stop)


# --- RabbitMQ ------------------------------------------------------------------------------------------------------


def _dlq(name: str) -> str:
    return f"{name}.dead"


async def rabbitmq_setup(url: str, name: str) -> None:
    import aio_pika

    async with await aio_pika.connect(url) as conn:
        channel = await conn.channel()
        await channel.declare_queue(_dlq(name), durable=True)
        await channel.declare_queue(name, durable=True, arguments={
            "x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": _dlq(name)})


async def rabbitmq_publish(url: str, name: str, messages: list[tuple[str, bytes]]) -> None:
    import aio_pika

    async with await aio_pika.connect(url) as conn:
        channel = await conn.channel(publisher_confirms=True)
        for start in range(0, len(messages), 200):
            await asyncio.gather(*(channel.default_exchange.publish(
                aio_pika.Message(body, message_id=mid, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=name) for mid, body in messages[start:start + 200]))


async def rabbitmq_left(url: str, name: str) -> tuple[int, int]:
    """(messages left on the queue, dead-lettered); only meaningful with no consumer holding unacked messages."""
    import aio_pika

    async with await aio_pika.connect(url) as conn:
        channel = await conn.channel()
        queue = await channel.declare_queue(name, passive=True)
        dead = await channel.declare_queue(_dlq(name), passive=True)
        return queue.declaration_result.message_count or 0, dead.declaration_result.message_count or 0


async def rabbitmq_teardown(url: str, name: str) -> None:
    import aio_pika

    async with await aio_pika.connect(url) as conn:
        channel = await conn.channel()
        await channel.queue_delete(name)
        await channel.queue_delete(_dlq(name))


def _rabbitmq_worker(worker: Worker, stop: threading.Event) -> None:
    import aio_pika
    from aio_pika.message import IncomingMessage

    from idem_dialects.aio import AsyncIdempotencyStore
    from idem_dialects.consumers.rabbitmq import IdempotentConsumer

    after_commit(worker, IncomingMessage, "ack")

    async def main() -> None:
        store = AsyncIdempotencyStore.from_url(async_url(parse(worker.db_url)), table_prefix=worker.prefix)
        apply = handler_effect(applied_table(worker.prefix), worker)

        async def handle(conn: Any, message: Any) -> None:
            await conn.run_sync(apply, message.message_id)

        consumer = IdempotentConsumer(store, handle, subscriber="proof", retry_delay=0.2)
        consumer.counts = Journal(worker.journal)
        inflight: set[asyncio.Task[Any]] = set()

        async def on_message(message: Any) -> None:
            task = asyncio.current_task()
            assert task is not None
            inflight.add(task)
            try:
                await consumer(message)
            finally:
                inflight.discard(task)

        connection = await aio_pika.connect_robust(worker.broker_url)
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=in_flight(store))
        queue = await channel.declare_queue(worker.name, passive=True)
        tag = await queue.consume(on_message)
        Path(worker.ready).touch()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await queue.cancel(tag)  # a clean stop: no new deliveries, the ones in hand settled before closing
        for _ in range(100):
            if not inflight:
                break
            await asyncio.sleep(0.1)
        await connection.close()
        await store.close()

    asyncio.run(main())


# --- NATS JetStream ------------------------------------------------------------------------------------------------


async def nats_setup(url: str, name: str) -> None:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

    nc = await nats.connect(url)
    js = nc.jetstream()
    # The proof's id is a header of its own (not Nats-Msg-Id): JetStream's publish deduplication must not catch the
    # duplicates, they have to reach the consumer's inbox.
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.in", f"{name}.dead"]))
    await js.add_consumer(name, ConsumerConfig(durable_name="proof", ack_policy=AckPolicy.EXPLICIT,
                                               ack_wait=ACK_WAIT, filter_subject=f"{name}.in",
                                               max_ack_pending=10 * BATCH))
    await nc.close()


async def nats_publish(url: str, name: str, messages: list[tuple[str, bytes]]) -> None:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    for start in range(0, len(messages), 200):
        await asyncio.gather(*(js.publish(f"{name}.in", body, headers={"Proof-Id": mid})
                               for mid, body in messages[start:start + 200]))
    await nc.close()


async def nats_left(url: str, name: str) -> tuple[int, int]:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    info = await js.consumer_info(name, "proof")
    dead = (await js.stream_info(name, subjects_filter=f"{name}.dead")).state.subjects or {}
    await nc.close()
    return info.num_pending + info.num_ack_pending, sum(dead.values())


async def nats_teardown(url: str, name: str) -> None:
    import nats

    nc = await nats.connect(url)
    await nc.jetstream().delete_stream(name)
    await nc.close()


def _nats_worker(worker: Worker, stop: threading.Event) -> None:
    import nats
    import nats.errors
    from nats.aio.msg import Msg

    from idem_dialects.aio import AsyncIdempotencyStore
    from idem_dialects.consumers.base import header
    from idem_dialects.consumers.nats import IdempotentConsumer

    after_commit(worker, Msg, "ack")

    async def main() -> None:
        store = AsyncIdempotencyStore.from_url(async_url(parse(worker.db_url)), table_prefix=worker.prefix)
        apply = handler_effect(applied_table(worker.prefix), worker)
        nc = await nats.connect(worker.broker_url, max_reconnect_attempts=-1)
        js = nc.jetstream()

        async def handle(conn: Any, msg: Any) -> None:
            await conn.run_sync(apply, msg.headers[worker.id_header])

        consumer = IdempotentConsumer(store, handle, subscriber="proof", message_id=header(worker.id_header),
                                      retry_delay=0.2, jetstream=js, dead_letter_subject=f"{worker.name}.dead")
        consumer.counts = Journal(worker.journal)
        sub = await js.pull_subscribe_bind("proof", stream=worker.name)
        Path(worker.ready).touch()
        while not stop.is_set():
            try:
                msgs = await sub.fetch(in_flight(store), timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):  # nats-py raises either when nothing came
                continue
            await asyncio.gather(*(consumer(msg) for msg in msgs))
        await nc.close()
        await store.close()

    asyncio.run(main())


# --- Redis Streams -------------------------------------------------------------------------------------------------


def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def redis_setup(url: str, name: str) -> None:
    client = _redis(url)
    client.xgroup_create(name, "proof", id="0", mkstream=True)
    client.close()


def redis_publish(url: str, name: str, messages: list[tuple[str, bytes]]) -> None:
    client = _redis(url)
    for start in range(0, len(messages), 500):
        with client.pipeline(transaction=False) as pipe:
            for mid, body in messages[start:start + 500]:
                pipe.xadd(name, {"id": mid, "body": body})
            pipe.execute()
    client.close()


def redis_left(url: str, name: str) -> tuple[int, int]:
    client = _redis(url)
    group = next(g for g in client.xinfo_groups(name) if g["name"] in (b"proof", "proof"))
    dead = client.xlen(_dlq(name))
    client.close()
    return int(group["pending"]) + int(group.get("lag") or 0), int(dead)


def redis_teardown(url: str, name: str) -> None:
    client = _redis(url)
    client.delete(name, _dlq(name))
    client.close()


def _redis_worker(worker: Worker, stop: threading.Event) -> None:
    import redis

    from idem_dialects.consumers.redis import StreamConsumer, field
    from idem_dialects.store import IdempotencyStore

    after_commit(worker, redis.Redis, "xack")
    store = IdempotencyStore.from_url(worker.db_url, table_prefix=worker.prefix)
    apply = handler_effect(applied_table(worker.prefix), worker)
    client = _redis(worker.broker_url)
    consumer = StreamConsumer(store, client, lambda conn, entry: apply(conn, entry.fields[b"id"].decode()),
                              stream=worker.name, group="proof", consumer=f"worker-{worker.number}",
                              subscriber="proof", message_id=field("id"), claim_idle=ACK_WAIT, batch=BATCH,
                              block=0.2, dead_letter_stream=_dlq(worker.name))
    consumer.counts = Journal(worker.journal)
    Path(worker.ready).touch()
    consumer.run(stop)
    client.close()
    store.close()


# --- one interface over the three ------------------------------------------------------------------------------------


def _sync(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A broker operation callable from sync code whether it is a coroutine function or not."""
    if asyncio.iscoroutinefunction(fn):
        return lambda *args: asyncio.run(fn(*args))
    return fn


OPERATIONS: dict[str, dict[str, Callable[..., Any]]] = {
    broker: {op: _sync(globals()[f"{broker}_{op}"]) for op in ("setup", "publish", "left", "teardown")}
    for broker in ("rabbitmq", "nats", "redis")
}
