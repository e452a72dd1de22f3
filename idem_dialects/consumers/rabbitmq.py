"""RabbitMQ through aio-pika: a consumer callback for ``queue.consume`` that acknowledges a message only after the
handler's transaction committed (manual acks), so nothing is lost by a crash and nothing is applied twice::

    consumer = IdempotentConsumer(store, handle, subscriber="billing")
    await queue.consume(consumer)   # no_ack=False, aio-pika's default

Dispositions: ack; `nack(requeue=True)` after `retry_delay` seconds (RabbitMQ has no delayed requeue); `reject(
requeue=False)`, which reaches the queue's dead-letter exchange (``x-dead-letter-exchange``; without one RabbitMQ
drops the message). Poison messages are counted by the quorum queue's ``x-delivery-count`` header; on a classic queue,
which does not count, by this consumer's own tally of failures (lost when it restarts).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika.exceptions
from aio_pika.abc import AbstractIncomingMessage
from sqlalchemy.ext.asyncio import AsyncConnection

from ..api import AsyncStoreAPI
from ..outcomes import Disposition, OnMismatch
from .base import ConsumerBase, MessageId, MessageScope, log

__all__ = ["IdempotentConsumer", "amqp_message_id"]  # public: the API reference documents each

Handler = Callable[[AsyncConnection, AbstractIncomingMessage], Awaitable[Any]]
_REMEMBERED_FAILURES = 10_000  # message ids whose failures a classic queue's consumer tallies itself
_BROKER_ERRORS = (aio_pika.exceptions.AMQPError, aio_pika.exceptions.ChannelInvalidStateError, ConnectionError)


def amqp_message_id(message: AbstractIncomingMessage) -> str | None:
    """The AMQP ``message-id`` property, set by the publisher (the same on every redelivery and publisher retry)."""
    return message.message_id


class IdempotentConsumer(ConsumerBase):
    """`await handler(conn, message)` once per message id, in the transaction that records the id; the message is
    acknowledged after the commit. `message_id` finds the id (default: the AMQP message-id property; `header(name)`
    for a header). A changed payload (body) under a known id gets `on_mismatch`'s disposition."""

    def __init__(self, store: AsyncStoreAPI[Any], handler: Handler, *, subscriber: str,
                 message_id: MessageId[AbstractIncomingMessage] = amqp_message_id,
                 on_mismatch: OnMismatch = Disposition.DEAD_LETTER, max_deliveries: int | None = 5,
                 retry_delay: float = 1.0, compare_payload: bool = True, scope: MessageScope | None = None) -> None:
        super().__init__(subscriber=subscriber, on_mismatch=on_mismatch, max_deliveries=max_deliveries,
                         retry_delay=retry_delay, compare_payload=compare_payload, scope=scope)
        self.store, self.handler, self.message_id = store, handler, message_id
        self._failures: OrderedDict[str, int] = OrderedDict()

    async def __call__(self, message: AbstractIncomingMessage) -> None:
        message_id = self.message_id(message)
        deliveries = self._deliveries(message, message_id)

        async def handle(conn: AsyncConnection) -> Any:
            return await self.handler(conn, message)

        disposition = await self.aprocess(self.store, message_id, message.body, handle, deliveries, message)
        self._remember(message_id, disposition)
        try:
            if disposition is Disposition.ACK:
                await message.ack()
            elif disposition is Disposition.RETRY:
                await asyncio.sleep(self.retry_delay)
                await message.nack(requeue=True)
            else:
                await message.reject(requeue=False)
        except _BROKER_ERRORS as exc:
            # The channel closed after the commit: RabbitMQ delivers the message again, and the inbox acks that.
            self.counts["unsettled"] += 1
            log.warning("%s: could not %s message %r (%s); the broker will deliver it again", self.subscriber,
                        disposition.value, message_id, type(exc).__name__)

    def _deliveries(self, message: AbstractIncomingMessage, message_id: object) -> int:
        """Which delivery this is: the quorum queue's count, else at least 2 when RabbitMQ says redelivered, and
        never fewer than the failures this consumer saw for the id."""
        counted = (message.headers or {}).get("x-delivery-count")
        broker = int(counted) + 1 if isinstance(counted, int) else (2 if message.redelivered else 1)
        return max(broker, self._failures.get(str(message_id), 0) + 1)

    def _remember(self, message_id: object, disposition: Disposition) -> None:
        key = str(message_id)
        if disposition is Disposition.RETRY:
            self._failures[key] = self._failures.get(key, 0) + 1
            self._failures.move_to_end(key)
            while len(self._failures) > _REMEMBERED_FAILURES:
                self._failures.popitem(last=False)
        else:
            self._failures.pop(key, None)
