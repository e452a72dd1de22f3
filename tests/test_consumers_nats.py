"""The NATS JetStream adapter (nats-py) on the machine's NATS and, for restarts, on a private nats-server: ack after
the commit, Nak with a delay on failures, poison and changed messages published to a dead-letter subject."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any

import pytest
from async_common import async_store_class
from consumer_common import Inbox, await_for

from idem_dialects.engines.brokers import BROKERS

nats = pytest.importorskip("nats", reason="nats-py is not installed (pip install 'idem-dialects[nats]')")
AsyncIdempotencyStore = async_store_class()  # skips, naming what to install, without greenlet
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig  # noqa: E402

from idem_dialects.consumers import DeadLetter, header  # noqa: E402
from idem_dialects.consumers.nats import REASON_HEADER, IdempotentConsumer  # noqa: E402


async def _stream(js: Any, name: str, ack_wait: float = 1.0, duplicate_window: float = 120.0) -> Any:
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.in", f"{name}.dead"], storage=StorageType.FILE,
                                     duplicate_window=duplicate_window))
    await js.add_consumer(name, ConsumerConfig(durable_name="billing", ack_policy=AckPolicy.EXPLICIT,
                                               ack_wait=ack_wait, filter_subject=f"{name}.in"))
    return await js.pull_subscribe_bind("billing", stream=name)


async def _settled(js: Any, name: str) -> bool:
    info = await js.consumer_info(name, "billing")
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


async def _pull(sub: Any, consumer: IdempotentConsumer, done: Callable[[], bool], timeout: float = 60) -> None:
    async def loop() -> None:
        while not done():
            try:
                msgs = await sub.fetch(10, timeout=0.3)
            except (TimeoutError, nats.errors.TimeoutError, nats.errors.ConnectionClosedError,
                    nats.js.errors.APIError):
                continue
            await asyncio.gather(*(consumer(msg) for msg in msgs))

    await asyncio.wait_for(loop(), timeout)


def test_duplicates_are_acked_and_failures_naked_with_a_delay(broker: Callable[..., str], inbox: Inbox) -> None:
    url, name = broker("nats"), f"idem_{secrets.token_hex(4)}"
    failures = {"m3": 2}  # m3's handler fails twice (Nak with delay), then succeeds

    async def main() -> IdempotentConsumer:
        store = AsyncIdempotencyStore.from_url(inbox.async_url, table_prefix=inbox.prefix)

        async def handle(conn: Any, msg: Any) -> None:
            order = msg.headers["Order-Id"]
            await conn.run_sync(inbox.apply, order)
            if failures.get(order):
                failures[order] -= 1
                raise TimeoutError("payment provider timed out")

        nc = await nats.connect(url)
        js = nc.jetstream()
        try:
            sub = await _stream(js, name)
            consumer = IdempotentConsumer(store, handle, subscriber="billing", message_id=header("Order-Id"),
                                          retry_delay=0.1)
            orders = [f"m{n}" for n in range(10)] + ["m1", "m2", "m3"]  # three published twice
            for order in orders:
                await js.publish(f"{name}.in", b"{}", headers={"Order-Id": order})
            await _pull(sub, consumer, lambda: consumer.counts["ack"] == len(orders))
            await await_for(lambda: _settled(js, name), what="every ack received by JetStream")
        finally:
            await js.delete_stream(name)
            await nc.close()
            await store.close()
        return consumer

    consumer = asyncio.run(main())
    assert inbox.applied() == {f"m{n}": 1 for n in range(10)}
    assert consumer.counts["duplicate"] == 3 and consumer.counts["retry"] == 2


def test_poison_changed_and_unidentified_messages_go_to_the_dead_letter_subject(broker: Callable[..., str],
                                                                                inbox: Inbox) -> None:
    url, name = broker("nats"), f"idem_{secrets.token_hex(4)}"

    async def main() -> tuple[IdempotentConsumer, list[Any]]:
        store = AsyncIdempotencyStore.from_url(inbox.async_url, table_prefix=inbox.prefix)

        async def handle(conn: Any, msg: Any) -> None:
            await conn.run_sync(inbox.apply, msg.headers["Nats-Msg-Id"])
            if msg.data == b"poison":
                raise ValueError("cannot parse")
            if msg.data == b"refused":
                raise DeadLetter("account closed")

        nc = await nats.connect(url)
        js = nc.jetstream()
        try:
            sub = await _stream(js, name, ack_wait=5.0, duplicate_window=0.2)
            consumer = IdempotentConsumer(store, handle, subscriber="billing", max_deliveries=3, retry_delay=0.05,
                                          jetstream=js, dead_letter_subject=f"{name}.dead")
            await js.publish(f"{name}.in", b"a", headers={"Nats-Msg-Id": "ok"})
            for body, mid in ((b"poison", "poison"), (b"refused", "refused")):
                await js.publish(f"{name}.in", body, headers={"Nats-Msg-Id": mid})
            await js.publish(f"{name}.in", b"no id")
            await _pull(sub, consumer, lambda: consumer.counts["ack"] == 1)
            # The same id with another payload, past JetStream's own duplicate window (which would drop it).
            await asyncio.sleep(0.3)
            await js.publish(f"{name}.in", b"changed", headers={"Nats-Msg-Id": "ok"})
            await _pull(sub, consumer, lambda: consumer.counts["dead-letter"] == 4)
            dead_sub = await js.subscribe(f"{name}.dead", ordered_consumer=True)
            dead = [await dead_sub.next_msg(timeout=5) for _ in range(4)]
        finally:
            await js.delete_stream(name)
            await nc.close()
            await store.close()
        return consumer, dead

    consumer, dead = asyncio.run(main())
    assert inbox.applied() == {"ok": 1}
    assert sorted(m.data for m in dead) == [b"changed", b"no id", b"poison", b"refused"]
    assert all(REASON_HEADER in (m.headers or {}) for m in dead)
    assert consumer.counts["mismatch"] == 1 and consumer.counts["no id"] == 1 and consumer.counts["retry"] == 2


def test_server_restart_loses_nothing_and_applies_nothing_twice(broker: Callable[..., str], inbox: Inbox) -> None:
    """A private nats-server (file storage) stopped and started again mid-stream: nats-py reconnects, messages whose
    ack was lost come back after the ack wait and are acked as duplicates."""
    broker("nats")
    server = BROKERS["nats"].private()
    ids = [f"m{n}" for n in range(400)]

    async def main() -> None:
        store = AsyncIdempotencyStore.from_url(inbox.async_url, table_prefix=inbox.prefix)

        async def handle(conn: Any, msg: Any) -> None:
            await conn.run_sync(inbox.apply, msg.headers["Nats-Msg-Id"])
            await asyncio.sleep(0.01)

        nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        js = nc.jetstream()
        sub = await _stream(js, "restart")
        for mid in ids:
            await js.publish("restart.in", mid.encode(), headers={"Nats-Msg-Id": mid})
        consumer = IdempotentConsumer(store, handle, subscriber="billing", retry_delay=0.1)
        restarted = asyncio.create_task(_restart_when(server, lambda: len(inbox.applied()) >= 100))
        await _pull(sub, consumer, lambda: len(inbox.applied()) == len(ids) and restarted.done(), timeout=120)

        await await_for(lambda: _settled(js, "restart"), timeout=30, what="nothing pending on the stream")
        await nc.close()
        await store.close()

    try:
        asyncio.run(main())
    finally:
        server.stop()
    assert inbox.applied() == dict.fromkeys(ids, 1)


async def _restart_when(server: Any, ready: Callable[[], bool]) -> None:
    await await_for(ready, timeout=60, what="a quarter applied")
    await asyncio.to_thread(server.restart)


def test_the_docstring_push_subscription_form_consumes(broker: Callable[..., str], inbox: Inbox) -> None:
    """The module docstring's push form (``js.subscribe(..., cb=consumer.__call__, manual_ack=True)``) is accepted by
    nats-py (which refuses a callback that is not a coroutine function) and consumes each message once."""
    url, name = broker("nats"), f"idem_{secrets.token_hex(4)}"

    async def main() -> IdempotentConsumer:
        store = AsyncIdempotencyStore.from_url(inbox.async_url, table_prefix=inbox.prefix)

        async def handle(conn: Any, msg: Any) -> None:
            await conn.run_sync(inbox.apply, msg.headers["Nats-Msg-Id"])

        nc = await nats.connect(url)
        js = nc.jetstream()
        try:
            await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.in"], storage=StorageType.FILE))
            consumer = IdempotentConsumer(store, handle, subscriber="billing")
            await js.subscribe(f"{name}.in", durable="billing", cb=consumer.__call__, manual_ack=True)
            for order in ("o-1", "o-2", "o-1"):  # o-1 published twice: JetStream's own window drops the second
                await js.publish(f"{name}.in", b"{}", headers={"Nats-Msg-Id": order})

            async def acked() -> bool:
                return consumer.counts["ack"] == 2

            await await_for(acked, what="both messages acked")
        finally:
            await js.delete_stream(name)
            await nc.close()
            await store.close()
        return consumer

    consumer = asyncio.run(main())
    assert consumer.counts["processed"] == 2
    assert inbox.applied() == {"o-1": 1, "o-2": 1}
