"""The Redis Streams adapter (redis-py) on the machine's Redis and, for restarts, on a private redis-server with an
append-only file: XACK after the commit, stale entries of a dead consumer claimed with XAUTOCLAIM, poison and
changed entries moved to a dead-letter stream in one MULTI/EXEC."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from consumer_common import Inbox, wait_for

from idem_dialects.engines.brokers import BROKERS

redis = pytest.importorskip("redis", reason="redis-py is not installed (pip install 'idem-dialects[redis]')")
from idem_dialects.consumers import DeadLetter  # noqa: E402
from idem_dialects.consumers.redis import ORIGIN_FIELD, REASON_FIELD, Entry, StreamConsumer, field  # noqa: E402


@pytest.fixture
def stream(broker: Callable[..., str]) -> Iterator[tuple[Any, str]]:
    client = redis.Redis.from_url(broker("redis"))
    name = f"idem-test-{secrets.token_hex(4)}"
    yield client, name
    client.delete(name, f"{name}.dead")
    client.close()


def _left(client: Any, name: str, group: str = "billing") -> int:
    info = next(g for g in client.xinfo_groups(name) if g["name"] == group.encode())
    return int(info["pending"]) + int(info.get("lag") or 0)


def test_duplicates_acked_and_a_dead_consumers_entries_claimed(stream: tuple[Any, str], inbox: Inbox) -> None:
    """Entries read by a consumer that died before acking are claimed by another once idle; duplicate publishes of
    an order id (new entry ids, same field) are acked without the handler."""
    client, name = stream

    def handle(conn: Any, entry: Entry) -> None:
        inbox.apply(conn, entry.fields[b"order"].decode())

    def consumer(member: str) -> StreamConsumer:
        return StreamConsumer(inbox.store, client, handle, stream=name, group="billing", consumer=member,
                              message_id=field("order"), claim_idle=0.3, block=0.05)

    first = consumer("dies")
    first.ensure_group()
    orders = [f"o{n}" for n in range(10)] + ["o1", "o2"]
    for order in orders:
        client.xadd(name, {"order": order})
    # "dies" reads five entries and never acknowledges them: they stay in its pending list.
    assert len(client.xreadgroup("billing", "dies", {name: ">"}, count=5)[0][1]) == 5
    survivor = consumer("survives")
    wait_for(lambda: survivor.poll() == 0 and _left(client, name) == 0, what="every entry acked")
    assert inbox.applied() == {f"o{n}": 1 for n in range(10)}
    assert survivor.counts["duplicate"] == 2 and survivor.counts["ack"] == len(orders)
    del first


def test_poison_changed_and_unidentified_entries_go_to_the_dead_letter_stream(stream: tuple[Any, str],
                                                                               inbox: Inbox) -> None:
    client, name = stream
    runs: dict[str, int] = {}

    def handle(conn: Any, entry: Entry) -> None:
        order = entry.fields[b"order"].decode()
        runs[order] = runs.get(order, 0) + 1
        inbox.apply(conn, order)
        if entry.fields.get(b"kind") == b"poison":
            raise ValueError("cannot parse")
        if entry.fields.get(b"kind") == b"refused":
            raise DeadLetter("account closed")

    consumer = StreamConsumer(inbox.store, client, handle, stream=name, group="billing", consumer="c1",
                              message_id=field("order"), claim_idle=0.1, block=0.05, max_deliveries=3,
                              dead_letter_stream=f"{name}.dead")
    consumer.ensure_group()
    client.xadd(name, {"order": "ok", "amount": "5"})
    client.xadd(name, {"order": "poison", "kind": "poison"})
    client.xadd(name, {"order": "refused", "kind": "refused"})
    client.xadd(name, {"order": "ok", "amount": "6"})  # the same order id with another payload
    client.xadd(name, {"amount": "7"})  # no order id at all
    wait_for(lambda: consumer.poll() == 0 and _left(client, name) == 0, what="every entry settled")
    dead = client.xrange(f"{name}.dead")
    assert sorted(fields.get(b"order", b"-") for _, fields in dead) == [b"-", b"ok", b"poison", b"refused"]
    assert all(REASON_FIELD.encode() in fields and ORIGIN_FIELD.encode() in fields for _, fields in dead)
    assert inbox.applied() == {"ok": 1} and runs == {"ok": 1, "poison": 3, "refused": 1}
    assert consumer.counts["mismatch"] == 1 and consumer.counts["no id"] == 1


def test_server_restart_loses_nothing_and_applies_nothing_twice(broker: Callable[..., str], inbox: Inbox) -> None:
    """A private redis-server (append-only file, fsync always) stopped mid-stream and started again: the consumer's
    loop waits it out, and entries whose XACK was lost are handled again as duplicates."""
    broker("redis")
    server = BROKERS["redis"].private()
    client = redis.Redis.from_url(server.url)
    ids = [f"o{n}" for n in range(500)]
    try:
        consumer = StreamConsumer(inbox.store, client, lambda conn, entry: inbox.apply(conn, entry.fields[b"o"]
                                                                                          .decode()),
                                  stream="orders", group="billing", consumer="c1", message_id=field("o"),
                                  claim_idle=0.5, block=0.05)
        consumer.ensure_group()
        with client.pipeline() as pipe:
            for order in ids:
                pipe.xadd("orders", {"o": order})
            pipe.execute()
        stop = threading.Event()
        loop = threading.Thread(target=consumer.run, args=(stop,))
        loop.start()
        try:
            wait_for(lambda: len(inbox.applied()) >= 100, what="a fifth applied")
            server.restart(kill=True)  # a crash: only what the append-only file holds survives
            wait_for(lambda: len(inbox.applied()) == len(ids), timeout=60, what="every entry applied")
            wait_for(lambda: _left(client, "orders") == 0, timeout=30, what="every entry acked")
        finally:
            stop.set()
            loop.join(10)
    finally:
        client.close()
        server.stop()
    assert inbox.applied() == dict.fromkeys(ids, 1)
