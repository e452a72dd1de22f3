"""NATS JetStream through nats-py: a message callback that acknowledges only after the handler's transaction
committed, and asks for a redelivery with a delay (``Nak`` with delay) when the database cannot be reached::

    consumer = IdempotentConsumer(store, handle, subscriber="billing")
    # nats-py wants a coroutine function as the callback: the consumer's bound __call__ is one
    await js.subscribe("orders.*", durable="billing", cb=consumer.__call__, manual_ack=True)
    # or, pulling: for msg in await sub.fetch(10): await consumer(msg)

The message id is the ``Nats-Msg-Id`` header by default, the one JetStream's own publish deduplication uses (within
the stream's duplicate window; the inbox holds it for as long as `purge` keeps processed messages). Dead-lettered
messages are published to `dead_letter_subject` (to a stream that captures it) with the reason in a header, then
terminated (``Term``); without a subject they are only terminated, which JetStream reports as an advisory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from sqlalchemy.ext.asyncio import AsyncConnection

from ..api import AsyncStoreAPI
from ..outcomes import Disposition, OnMismatch
from .base import ConsumerBase, MessageId, MessageScope, header, log, text

__all__ = ["MSG_ID_HEADER", "IdempotentConsumer", "nats_msg_id"]  # public: the API reference documents each

Handler = Callable[[AsyncConnection, Msg], Awaitable[Any]]
REASON_HEADER = "Idem-Dead-Letter-Reason"
_BROKER_ERRORS = (nats.errors.Error, ConnectionError)
MSG_ID_HEADER = "Nats-Msg-Id"
"""The header JetStream's own deduplication reads the publisher's message id from."""
nats_msg_id = header(MSG_ID_HEADER)
"""The default `message_id`: the publisher's id in the Nats-Msg-Id header, which JetStream's deduplication uses."""


class IdempotentConsumer(ConsumerBase):
    """`await handler(conn, msg)` once per message id, in the transaction that records the id; `msg.ack()` after
    the commit. `message_id` finds the id (default: the ``Nats-Msg-Id`` header)."""

    def __init__(self, store: AsyncStoreAPI[Any], handler: Handler, *, subscriber: str,
                 message_id: MessageId[Msg] = nats_msg_id,
                 on_mismatch: OnMismatch = Disposition.DEAD_LETTER, max_deliveries: int | None = 5,
                 retry_delay: float = 1.0, compare_payload: bool = True, jetstream: JetStreamContext | None = None,
                 dead_letter_subject: str | None = None, scope: MessageScope | None = None) -> None:
        super().__init__(subscriber=subscriber, on_mismatch=on_mismatch, max_deliveries=max_deliveries,
                         retry_delay=retry_delay, compare_payload=compare_payload, scope=scope)
        if (jetstream is None) != (dead_letter_subject is None):
            raise ValueError("give jetstream and dead_letter_subject together: dead-lettered messages are published"
                             " through that JetStream context to that subject")
        self.store, self.handler, self.message_id = store, handler, message_id
        self.jetstream, self.dead_letter_subject = jetstream, dead_letter_subject

    async def __call__(self, msg: Msg) -> None:
        message_id = self.message_id(msg)

        async def handle(conn: AsyncConnection) -> Any:
            return await self.handler(conn, msg)

        disposition = await self.aprocess(self.store, message_id, msg.data, handle, msg.metadata.num_delivered, msg)
        try:
            if disposition is Disposition.ACK:
                await msg.ack()
            elif disposition is Disposition.RETRY:
                await msg.nak(delay=self.retry_delay)
            else:
                await self._dead_letter(msg, message_id)
        except _BROKER_ERRORS as exc:
            # Not settled: JetStream delivers it again after the consumer's ack wait, and the inbox acks that.
            self.counts["unsettled"] += 1
            log.warning("%s: could not %s message %r (%s); JetStream will deliver it again", self.subscriber,
                        disposition.value, message_id, type(exc).__name__)

    async def _dead_letter(self, msg: Msg, message_id: object) -> None:
        if self.jetstream is not None and self.dead_letter_subject is not None:
            headers = dict(msg.headers or {})
            # The original Nats-Msg-Id would make JetStream drop the dead letter as a duplicate of the message
            # itself (same stream, within its window); an id of its own drops only a second dead letter of it.
            headers.pop(MSG_ID_HEADER, None)
            headers[REASON_HEADER] = f"{self.subscriber} gave up on {msg.subject}"
            if text(message_id):
                headers[MSG_ID_HEADER] = f"{self.subscriber}:dead-letter:{text(message_id)}"
            await self.jetstream.publish(self.dead_letter_subject, msg.data, headers=headers)  # stored, then Term
        await msg.term()
