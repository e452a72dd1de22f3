"""Redis Streams through redis-py: a consumer-group reader that acknowledges an entry (``XACK``) only after the
handler's transaction committed, and claims entries left pending by consumers that died (``XAUTOCLAIM``)::

    consumer = StreamConsumer(store, client, handle, stream="orders", group="billing", consumer="billing-1")
    consumer.ensure_group()
    consumer.run(stop)   # or call consumer.poll() from a loop of your own

A retried entry is simply left pending: it is claimed again (by this consumer or another) once it has been idle
for `claim_idle` seconds, which is the redelivery delay. Redis assigns a new entry id to every ``XADD``, so the
entry id only recognises redeliveries; a publisher that may add the same message twice must put its own id in a
field (``message_id=field("id")``). A dead-lettered entry is added to `dead_letter_stream` and acknowledged in one
``MULTI``/``EXEC`` transaction (without a dead-letter stream it is only acknowledged, and logged).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
import redis.exceptions
from sqlalchemy.engine import Connection

from ..api import StoreAPI
from ..outcomes import Disposition, OnMismatch
from .base import ConsumerBase, MessageId, MessageScope, log

__all__ = ["Entry", "StreamConsumer", "field"]  # public: the API reference documents each

REASON_FIELD = "idem-dead-letter-reason"
ORIGIN_FIELD = "idem-origin-id"
_BROKER_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry as delivered: its id, its fields (bytes or str, as the client decodes them) and which
    delivery of it this is."""

    stream: str
    id: str
    fields: Mapping[Any, Any]
    deliveries: int


Handler = Callable[[Connection, Entry], Any]


def entry_id(entry: Entry) -> str:
    return entry.id


def field(name: str) -> MessageId[Entry]:
    """A message id taken from one of the entry's fields."""
    return lambda entry: entry.fields.get(name, entry.fields.get(name.encode()))


def fields_payload(fields: Mapping[Any, Any]) -> bytes:
    """The entry's fields in one canonical byte form (order-free), for the payload fingerprint."""
    parts: list[bytes] = []
    for key, value in sorted((_bytes(k), _bytes(v)) for k, v in fields.items()):
        parts += [len(key).to_bytes(4, "big"), key, len(value).to_bytes(4, "big"), value]
    return b"".join(parts)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StreamConsumer(ConsumerBase):
    """`handler(conn, entry)` once per message id, in the transaction that records the id; ``XACK`` after the commit.
    `subscriber` defaults to the group's name; `consumer` is this reader's name in the group (keep it stable across
    restarts: the entries it had read are read again first)."""

    def __init__(self, store: StoreAPI[Any], client: redis.Redis, handler: Handler, *, stream: str,
                 group: str, consumer: str, subscriber: str | None = None, message_id: MessageId[Entry] = entry_id,
                 on_mismatch: OnMismatch = Disposition.DEAD_LETTER, max_deliveries: int | None = 5,
                 claim_idle: float = 30.0, batch: int = 10, block: float = 1.0, compare_payload: bool = True,
                 dead_letter_stream: str | None = None, scope: MessageScope | None = None) -> None:
        super().__init__(subscriber=subscriber or group, on_mismatch=on_mismatch, max_deliveries=max_deliveries,
                         retry_delay=claim_idle, compare_payload=compare_payload, scope=scope)
        if batch < 1 or block < 0:
            raise ValueError(f"batch must be >= 1 and block >= 0 seconds, got batch={batch!r}, block={block!r}")
        self.store, self.client, self.handler, self.message_id = store, client, handler, message_id
        self.stream, self.group, self.consumer = stream, group, consumer
        self.batch, self.block, self.dead_letter_stream = batch, block, dead_letter_stream
        self._own_pending = True  # read first what this consumer name had read before a restart

    def ensure_group(self, start: str = "0") -> None:
        """Create the consumer group (and the stream) unless it exists; `start` "0" reads the stream from its
        beginning, "$" only entries added from now on."""
        try:
            self.client.xgroup_create(self.stream, self.group, id=start, mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def poll(self) -> int:
        """One round: this consumer's own pending entries (after a restart), entries idle longer than `claim_idle`
        in other consumers' (or its own) pending lists, then new entries (waiting up to `block` seconds). Returns
        how many entries were handled."""
        entries = self._own() if self._own_pending else []
        entries += self._claimed()
        if not entries:
            replies: Any = self.client.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=self.batch,
                                                  block=int(self.block * 1000))
            entries = [Entry(self.stream, _text(i), f, 1) for _, found in replies or [] for i, f in found]
        for entry in entries:
            self._handle(entry)
        return len(entries)

    def run(self, stop: threading.Event | None = None) -> None:
        """`poll` until `stop` is set; a lost connection to Redis is waited out (redis-py reconnects)."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                self.poll()
            except _BROKER_ERRORS as exc:
                log.warning("%s: Redis unreachable (%s); retrying in 1 s", self.subscriber, type(exc).__name__)
                stop.wait(1.0)

    def _own(self) -> list[Entry]:
        replies: Any = self.client.xreadgroup(self.group, self.consumer, {self.stream: "0"}, count=self.batch)
        found = [(_text(i), f) for _, entries in replies or [] for i, f in entries]
        if len(found) < self.batch:
            self._own_pending = False  # caught up: from now on, new entries and stale claims only
        return self._counted_entries(found)

    def _claimed(self) -> list[Entry]:
        reply: Any = self.client.xautoclaim(self.stream, self.group, self.consumer, int(self.retry_delay * 1000),
                                       "0-0", count=self.batch)
        return self._counted_entries([(_text(i), f) for i, f in reply[1]])

    def _counted_entries(self, found: list[tuple[str, Any]]) -> list[Entry]:
        entries = []
        for entry_id_, fields in found:
            if not fields:  # trimmed from the stream while pending: nothing left to process
                self.client.xack(self.stream, self.group, entry_id_)
                continue
            pending: Any = self.client.xpending_range(self.stream, self.group, entry_id_, entry_id_, 1)
            deliveries = int(pending[0]["times_delivered"]) if pending else 1
            entries.append(Entry(self.stream, entry_id_, fields, deliveries))
        return entries

    def _handle(self, entry: Entry) -> None:
        message_id = self.message_id(entry)
        disposition = self.process(self.store, message_id, fields_payload(entry.fields),
                                   lambda conn: self.handler(conn, entry), entry.deliveries, entry)
        try:
            if disposition is Disposition.ACK:
                self.client.xack(self.stream, self.group, entry.id)
            elif disposition is Disposition.DEAD_LETTER:
                self._dead_letter(entry)
            # RETRY: left pending; claimed again once idle for claim_idle seconds
        except _BROKER_ERRORS as exc:
            self.counts["unsettled"] += 1
            log.warning("%s: could not %s entry %s (%s); it stays pending and is claimed again", self.subscriber,
                        disposition.value, entry.id, type(exc).__name__)

    def _dead_letter(self, entry: Entry) -> None:
        if self.dead_letter_stream is None:
            log.error("%s: dropping entry %s of %s: no dead_letter_stream is configured", self.subscriber, entry.id,
                      self.stream)
            self.client.xack(self.stream, self.group, entry.id)
            return
        with self.client.pipeline(transaction=True) as pipe:
            fields = {**entry.fields, REASON_FIELD: f"{self.subscriber} gave up", ORIGIN_FIELD: entry.id}
            pipe.xadd(self.dead_letter_stream, fields)
            pipe.xack(self.stream, self.group, entry.id)
            pipe.execute()
